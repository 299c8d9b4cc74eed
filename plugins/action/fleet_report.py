# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.fleet_report: what the run left in the inventory, read once, judged by plugin_utils
(_verdict for the verification, _drift for the drift) and written by _reports."""


import os

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.proxmox.plugins.modules.fleet_report import ARGUMENT_SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _drift, _reports, _verdict
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils._action import ControllerAction, host_fact, host_var


class Run(object):
    """What one run left in the inventory, as the report needs it, each host variable read once: the fleet as the
    first node that read it saw it (with --limit, maybe not the first node), the part of it this run planned (a run
    limited to some nodes leaves the others' containers out of the verdict and the drift), and each container's
    verify report."""

    def __init__(self, hostvars, groups, args):
        self.hostvars, self.reads = hostvars, args['reads']
        self.nodes = list(groups.get(args['nodes_group']) or [])
        self.containers = list(groups.get(args['containers_group']) or [])
        reconciles = ((n, self.var(n, 'reconcile')) for n in self.nodes)
        reader, self.reconcile = next(((n, r) for n, r in reconciles if r is not None), (None, {}))
        definition = (self.var(reader, 'definition') or []) if reader else []
        plan = (self.var(reader, 'plan') or {}) if reader else {}
        planned = plan.get('hosts')
        self.gpus = dict((vmid, h.get('gpus') or []) for vmid, h in (planned or {}).items())
        # the nodes the run could not reach: their containers are judged (unreached), not left out
        self.unreachable = set(plan.get('nodes_down') or [])
        self.definition = [e for e in definition if planned is None or not isinstance(e, dict)
                           or e.get('vmid') in planned or e.get('node') in self.unreachable]
        self.verify_reports = dict((h, host_fact(hostvars, h, self.reads['report'])) for h in self.containers)

    def var(self, host, what, default=None):
        """The host's variable that holds what (one of the module's reads)."""
        return host_var(self.hostvars, host, self.reads[what], default)

    def reports(self, run_id):
        """The verify reports of this run (with run_id, only those stamped with it)."""
        return [r for r in self.verify_reports.values() if r and (run_id is None or r.get('run') == run_id)]

    def devices(self):
        return dict((n, self.var(n, 'devices') or {}) for n in self.nodes)

    def failed(self):
        """{container host: the message of its venv build that failed} (a repair that could not be made, a Python no
        lock covers), or of its change refused where no snapshot could be taken first: why the container was not
        verified."""
        out = {}
        for h in self.containers:
            build = self.var(h, 'build') or {}
            snapshot = self.var(h, 'snapshot') or {}
            if build.get('failed') and build.get('msg'):
                out[h] = str(build['msg'])
            elif build.get('held') and snapshot.get('go') is False:
                out[h] = ('its change was refused: PVE cannot snapshot it first ({0}); -e '
                          'gpu_container_snapshot_optional=true makes it without one').format(snapshot.get('why'))
        return out

    def running(self):
        out = {}
        for h in self.containers:
            build = self.var(h, 'build') or {}
            # the driver step's result: the venv build's where it made it (gpu_container_driver_with_venv)
            out[h] = {'driver': build.get('driver') or self.var(h, 'driver'), 'build': build or None,
                      'report': self.verify_reports[h], 'engine': self.var(h, 'engine')}
        return out


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def act(self, args, task_vars):
        check_mode = bool(self._task.check_mode)
        seen = Run(task_vars.get('hostvars') or {}, task_vars.get('groups') or {}, args)
        out, written, removed = {}, [], []
        try:
            verdict = None
            if args['verdict']:
                run = args['run'] or {}
                reports = seen.reports(run.get('id'))
                verdict = _verdict.fleet(reports, seen.definition, seen.reconcile, run, check_mode, seen.unreachable,
                                         seen.gpus, seen.failed(), args['limit'], args['containers_group'])
                verdict['nodes'] = _verdict.nodes(seen.devices())
                judged = set(row['host'] for row in verdict['containers'] if row['state'] in ('verified', 'failed', 'rolled_back'))
                files = dict((r['host'], r) for r in reports if r.get('host') in judged)
                files['summary'] = verdict
                done = _reports.write_all(args['dir'], files, prune_others=True)
                written += done[0]
                removed += done[1]
                out['fleet'] = verdict
            if args['drift']:
                drift = _drift.fleet(seen.devices(), seen.reconcile, seen.definition, seen.running(), verdict,
                                     check_mode, seen.gpus)
                done = _reports.write_all(os.path.join(args['dir'], 'drift'), _drift.reports(drift), prune_others=True)
                written += done[0]
                removed += done[1]
                out['drift'] = drift
        except _reports.ReportError as e:
            raise AnsibleActionFail(str(e))
        return dict(out, changed=False, written=written, removed=removed)
