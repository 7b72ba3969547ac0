"""A shared device lab through labgrid (the ``lab`` extra: ``pip install 'edgekit[lab]'``).

``devices/coordinator.py``: place reservations on a labgrid coordinator (``EDGEKIT_COORDINATOR=host:port``),
taken by every DeviceSession on an inventory device (in the device layer: the session holds them); ``export.py``
here: inventory devices as labgrid places
(and the exporter config that gives them their SSH/ADB resources). Nothing here imports labgrid at
module import time: edgekit without the extra never pays for it.
"""
