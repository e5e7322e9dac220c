"""Compute-node side: choose wheels from a wheelhouse, install them offline under a lock, verify them.

- :mod:`porter.install.env`: inspect the target interpreter and the node's GPU;
- :mod:`porter.install.wheelhouse`: scan, match, check and index a wheelhouse;
- :mod:`porter.install.engine`: ``porter install``;
- :mod:`porter.install.records`: the install records that carry each manifest into the environment;
- :mod:`porter.install.verify`: ``porter verify`` and ``porter report``.
"""
