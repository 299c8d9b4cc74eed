# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action for gpufleet.proxmox.verify_container: one container's verification in one task. The decisions are
plugin_utils _verdict's; this runs the modules they call for (slurp of the venv's marker, venv_audit,
torch_verify) over the task's connection."""


from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.proxmox.plugins.modules.verify_container import ARGUMENT_SPEC as SPEC
from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _container_python, _verdict


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(SPEC)

    def _module(self, name, args, task_vars):
        return self._execute_module(module_name=name, task_vars=task_vars,
                                    module_args=dict((k, v) for k, v in args.items() if v is not None))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=SPEC)[1]
        built = args['build'] or {}
        marker = None
        if 'id' not in built and not built.get('container_python'):
            # torch_venv did not run: the venv's marker says what it was built from
            read = self._module('ansible.legacy.slurp', {'src': args['venv'] + '/gpufleet-venv.json'}, task_vars)
            marker = read.get('content') if not read.get('failed') else None
        now = _verdict.state({
            'marker': marker, 'built': built, 'driver': args['driver'], 'gpus': args['gpus'],
            'devices': args['devices'], 'node_driver': args['node_driver'],
            'container_changed': args['container_changed'], 'venv': args['venv'],
            'check_mode': self._play_context.check_mode,
            'settings': dict((k, args[k]) for k in ('expect', 'require_cuda', 'smoke', 'min_tflops', 'compile_check',
                                                    'compile_backend', 'collective', 'min_allreduce_gbps',
                                                    'min_shm_mb_per_gpu', 'min_nofile', 'rdma', 'train_step',
                                                    'throughput_baseline',
                                                    'max_throughput_drop',
                                                    'audit_mode', 'max_age', 'user'))})
        audit, probe = now['audit'], now['result']
        python = built.get('container_python')  # torch_venv found the container's Python missing (check runs)
        if not now['reuse'] and not python and not now['audited']:
            audit = self._module('gpufleet.proxmox.venv_audit', {
                'venv': args['venv'], 'lock': now['meta'].get('lock'),
                'overrides': now['meta'].get('overrides') or [], 'mode': args['audit_mode'],
                'imports': now['meta'].get('imports') or ['torch']}, task_vars)
            if _container_python.unreadable(audit):
                python = _container_python.diagnose(self, _container_python.interpreter_of(self, task_vars))
        if python:  # nothing runs in the container without it: the finding is its verification's failure
            audit = {'failed': True, 'msg': '{0}; fix: {1}'.format(python['msg'], python['fix'])}
            probe = {'failures': [{'check': 'container_python', 'expected': 'the container\'s Python starts',
                                   'actual': python['msg'], 'fix': python['fix']}], 'msg': audit['msg']}
        elif not now['reuse']:
            expect = now['expect']
            probe = self._module('gpufleet.proxmox.torch_verify', dict(
                venv=args['venv'], require_cuda=now['cuda'], smoke=args['smoke'],
                min_tflops=args['min_tflops'] or None, compile_check=args['compile_check'],
                compile_backend=args['compile_backend'], timeout=args['timeout'], collective=args['collective'],
                min_allreduce_gbps=args['min_allreduce_gbps'] or None, min_shm_mb_per_gpu=args['min_shm_mb_per_gpu'],
                min_nofile=args['min_nofile'], memlock_unlimited=args['rdma'],
                train_step=args['train_step'], max_throughput_drop=args['max_throughput_drop'],
                baseline_path=args['throughput_baseline'] if args['train_step'] and args['throughput_baseline'] else None,
                user=args['user'] if args['gpus'] and args['user'] else None,
                # the record is written where torch_venv ran, so that a drift run can find it
                record_fingerprint=now['fingerprint'] if 'id' in built else None,
                **dict(('expect_' + k, v) for k, v in expect.items() if v not in (None, ''))), task_vars)
        if not python:  # the node's driver below the venv's floor: said even where torch imported and counted
            probe = _verdict.with_failure(probe, now['below_floor'])
        # the container (a node's play verifies one by delegating to it: verify's tasks_from container)
        host = self._task.delegate_to or task_vars.get('inventory_hostname')
        report = _verdict.report(now, audit, probe, host, args['node'], args['vmid'], args['run'])
        if args['rolled_back']:
            report['rolled_back'] = _verdict.rolled_back(args['rolled_back'])
        result.update(changed=False, state=now, ansible_facts={
            'verify_audit': _verdict.plain(audit), 'verify_result': _verdict.plain(probe), 'verify_report': report})
        if report.get('rolled_back'):
            result['msg'] = '{0}: {1}'.format(host, '; '.join(_verdict.row(report)['failures']))
        elif not report['ok']:
            result['msg'] = '{0}: {1}'.format(host, '; '.join(_verdict.problems(audit, probe)))
        return result
