"""The host machinery a simulated device runs on: a real sshd (``sshd.py``) in its own network namespace
(``netns.py``) with its own address, CPU-throttled through cgroups when root (``cgroup.py``), its processes
(``procs.py``) and state files (``state.py``). The simulated devices themselves (registered in the inventory,
provisioned) are ``devices/sim_device.py`` and ``devices/sim_arm64.py`` (the arm64 twin)."""
