# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment(object):
    DOCUMENTATION = r'''
options:
  api_host:
    description:
      - A node of the cluster whose API to use (any node answers for the whole cluster), or several - the first
        that answers serves the task, so a node that is down does not stop the run.
      - Falls back to the E(PROXMOX_HOST) environment variable (several, separated by commas).
    type: list
    elements: str
    required: true
  api_port:
    description:
      - Port of the PVE API. Falls back to E(PROXMOX_PORT).
    type: int
    default: 8006
  api_user:
    description:
      - The user to log in as, with its realm (V(root@pam), V(automation@pve)). Falls back to E(PROXMOX_USER).
      - With O(api_token_id), the user the token belongs to.
    type: str
    required: true
  api_password:
    description:
      - The user's password. Falls back to E(PROXMOX_PASSWORD).
      - Device passthrough (C(devN)) can only be configured by V(root@pam) logged in with its password.
    type: str
  api_otp:
    description:
      - A current one-time code (TOTP) for a O(api_user) with two-factor authentication, which PVE asks for after the
        password. Falls back to E(PROXMOX_OTP).
      - A TOTP code is good for a short time only and every task logs in anew, so it suits short runs
        (C(-e gpufleet_api_otp=123456)); unattended runs need a login without a second factor.
    type: str
  api_token_id:
    description:
      - The name of an API token of O(api_user) (the part after C(!)). Falls back to E(PROXMOX_TOKEN_ID).
    type: str
  api_token_secret:
    description:
      - The token's secret. Falls back to E(PROXMOX_TOKEN_SECRET).
    type: str
  validate_certs:
    description:
      - Verify the API's TLS certificate. Falls back to E(PROXMOX_VALIDATE_CERTS).
      - Keep it on; give O(ca_path) for a private CA such as the cluster's own C(pve-root-ca.pem).
    type: bool
    default: true
  ca_path:
    description:
      - A PEM file of the CA(s) to verify the API's certificate with. Falls back to E(PROXMOX_CA_PATH).
    type: path
  timeout:
    description:
      - Seconds to wait for each PVE task (create, start, stop, destroy) to finish.
    type: int
    default: 300
requirements:
  - proxmoxer >= 2.0
  - requests
notes:
  - Secrets (O(api_password), O(api_token_secret)) are never logged.
'''
