"""edgekit's version, in the root layer: the modules that record it (a report's ``edgekit_version``,
``edgekit --version``) read it here, not from the package's ``__init__`` (the public API, which names them all)."""

__version__ = "0.1.0"
