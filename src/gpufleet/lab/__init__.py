"""The lab: a local Proxmox node (fakepve's API over real LXC containers) for tests and demos."""
