# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the collection's controller-side actions share: their task's arguments checked against the spec that
lives beside the module's DOCUMENTATION, and the inventory's host variables read as plain data."""


from ansible.plugins.action import ActionBase


def plain(value):
    """A host variable as plain data (Ansible's lazy containers made into dicts and lists)."""
    if isinstance(value, dict) or hasattr(value, 'items'):
        return dict((k, plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def host_var(hostvars, host, name, default=None):
    """One variable of a host of the inventory, as plain data; default where the host or the variable is not
    there."""
    try:
        value = hostvars[host].get(name)
    except KeyError:
        return default
    return default if value is None else plain(value)


def host_fact(hostvars, host, name, default=None):
    """One of a host's facts (ansible_facts[name]) as plain data, without copying the host's other facts."""
    try:
        value = (hostvars[host].get('ansible_facts') or {}).get(name)
    except KeyError:
        return default
    return default if value is None else plain(value)


class ControllerAction(ActionBase):
    """An action that runs in the controller's process and needs no connection: subclasses set ARGUMENT_SPEC (the
    module file's) and act(args, task_vars), which returns what goes into the result."""

    TRANSFERS_FILES = False
    _requires_connection = False
    ARGUMENT_SPEC = {}

    def run(self, tmp=None, task_vars=None):
        result = super(ControllerAction, self).run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)[1]
        result.update(self.act(args, task_vars or {}))
        return result

    def act(self, args, task_vars):
        raise NotImplementedError
