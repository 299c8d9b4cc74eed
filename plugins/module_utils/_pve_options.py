# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PVE API connection options of the collection's modules: community.proxmox's names, with PROXMOX_*
environment fallbacks. They are checked where the arguments are (AnsibleModule in a module, or on the controller
before a module's work runs as a program), not where the client (_pve) runs, which needs no Ansible."""


from ansible.module_utils.basic import env_fallback

CONNECTION_SPEC = dict(
    api_host=dict(type='list', elements='str', required=True, fallback=(env_fallback, ['PROXMOX_HOST'])),
    api_port=dict(type='int', default=8006, fallback=(env_fallback, ['PROXMOX_PORT'])),
    api_user=dict(type='str', required=True, fallback=(env_fallback, ['PROXMOX_USER'])),
    api_password=dict(type='str', no_log=True, fallback=(env_fallback, ['PROXMOX_PASSWORD'])),
    api_otp=dict(type='str', no_log=True, fallback=(env_fallback, ['PROXMOX_OTP'])),
    api_token_id=dict(type='str', no_log=False, fallback=(env_fallback, ['PROXMOX_TOKEN_ID'])),
    api_token_secret=dict(type='str', no_log=True, fallback=(env_fallback, ['PROXMOX_TOKEN_SECRET'])),
    validate_certs=dict(type='bool', default=True, fallback=(env_fallback, ['PROXMOX_VALIDATE_CERTS'])),
    ca_path=dict(type='path', fallback=(env_fallback, ['PROXMOX_CA_PATH'])),
    timeout=dict(type='int', default=300),
)
CONNECTION_REQUIRED_ONE_OF = [('api_password', 'api_token_id')]
CONNECTION_REQUIRED_TOGETHER = [('api_token_id', 'api_token_secret')]
