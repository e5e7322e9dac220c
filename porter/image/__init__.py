"""Node-ready images: an Apptainer image of a base userspace plus porter's wheels, installed and verified by porter.

:mod:`porter.image.definition` writes the definition file (what a site builds with its own ``apptainer``);
:mod:`porter.image.build` builds the SIF here, running the definition's own install steps itself where
``apptainer`` cannot run them (in a chroot).
"""

COMPRESSION = ("gzip", "zstd")
"""How an image's squashfs root file system may be compressed (``porter image build --compression``): gzip is
apptainer's own default; zstd packs many times faster and needs a zstd-capable squashfs reader on the node."""
