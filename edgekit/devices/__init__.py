"""Devices and what guards them: the inventory, locks and leases, provisioning, this host's setup
for a target, and the device stage of a run (session)."""
