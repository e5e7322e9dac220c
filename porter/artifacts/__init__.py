"""What porter produces: local version labels, wheels, and the manifest each wheel carries.

One owner per fact: :mod:`.labels` makes and parses labels, :mod:`.wheelfile` writes every wheel,
:mod:`.manifest` builds and reads every manifest.
"""
