"""Scripts porter runs in a *foreign* python (the build python, a compute node's venv).

They use the standard library only (the foreign python need not have porter) and speak one
protocol: :mod:`.protocol` prints one JSON document after a marker line on the real stdout, whatever
the probed code printed before. :func:`porter.probe.run_probe` sends a script on stdin (no file is
written anywhere, so a chroot or container needs nothing staged), through an executor, and reads
the document back. A script is this folder's ``protocol.py``, then the parts it imports, then itself;
lines ending in ``# porter: concatenated`` are those imports, which concatenation replaces.
"""
