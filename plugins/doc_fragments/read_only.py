# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment(object):
    # The attributes of a module that only reads.
    DOCUMENTATION = r'''
attributes:
  check_mode:
    support: full
    description: Reads only, so it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing to show.
'''
