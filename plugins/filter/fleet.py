# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the fleet definition (the logic lives in plugin_utils/_fleet).
Each filter imports its module_utils when it is called: Ansible loads this file in every worker that uses any of
its filters, and most use one."""


import importlib


def _utils(name):
    return importlib.import_module('ansible_collections.gpufleet.proxmox.plugins.plugin_utils.' + name)


def fleet_hosts(running, fleet, devices=None):
    return _utils('_fleet').hosts(running, fleet, devices)


def fleet_power(specs, restart):
    return _utils('_fleet').power(specs, restart)


class FilterModule(object):
    def filters(self):
        return {'fleet_power': fleet_power, 'fleet_hosts': fleet_hosts}
