"""The pieces of the lab node on the host: each one made by `up` and taken away by `down`.

Every function here is idempotent.  What `up` changes outside the lab's own
directories (device nodes, the bridge, NAT, sysctls, /etc/subuid, the `pct`
link) is written down in the lab's host record, and `down` undoes exactly that.

base: preflight, subordinate ids, the Debian base, the wheelhouse; gpus: the stand-in GPUs and driver;
network: bridge and NAT; tls: the API's certificate and credentials; services: sshd, pct and pvesm, the API
daemon.
"""

from ._util import LabError, sh  # noqa: F401
from .base import (  # noqa: F401
    ensure_base, ensure_subids, ensure_templates, ensure_wheelhouse, make_template, preflight, remove_subids,
    shift_ids)
from .gpus import (  # noqa: F401
    DRIVER_PACKAGES, KERNEL, add_kernel, dkms_build, dkms_built, ensure_boot_id, ensure_gpus, ensure_kernel,
    free_dynamic_major, gpu_record_key, hold_driver, install_driver, installed_version, loaded_version,
    lose_gpu_nodes, offer_driver, offers, read_dpkg, real_nvidia, remove_gpus, remove_kernel, reset_kernel, running_kernel,
    swap_cards, version_key, write_dpkg, write_userspace)
from .network import ensure_network, ensure_sysctls, remove_network, remove_sysctls  # noqa: F401
from .services import (  # noqa: F401
    code_version, daemon_running, ensure_commands, ensure_sshd, remove_commands, remove_lxc_cgroups, sshd_running,
    start_daemon, stop_daemon, stop_sshd, wait_api)
from .tls import ensure_credentials, ensure_tls  # noqa: F401
