"""gpufleet: the command line and the local Proxmox lab for the gpufleet.proxmox collection."""

__version__ = '0.1.0'
