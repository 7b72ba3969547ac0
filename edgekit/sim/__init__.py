"""A simulated device on this machine: a real sshd (in its own network namespace with its own
address, CPU-throttled through cgroups when root), registered in the device inventory."""
