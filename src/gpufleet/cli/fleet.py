"""`gpufleet up`, `gpufleet drift [--fix]`, `gpufleet verify`, `gpufleet doctor`, `gpufleet driver-upgrade` and
`gpufleet rollback`: the
collection's playbooks run through ansible-runner, with live progress, a table per container at the end (or --json),
and exit codes for cron:

    0  clean: the run succeeded and verified every container of the fleet definition (drift: and found none)
    1  error: a task failed (a repair, a verification), a container of the fleet is missing, stopped or was
       not verified, or the run could not start
    2  drift found (with --fix: found and repaired, and the fleet verified; or written and waiting for a restart);
       drift only
    3  the fleet is clean, but containers outside its definition carry its tag (orphans: left alone, their GPUs
       held); drift only
    4  hosts unreachable

Each run keeps its artifacts and reports under a private (0700) directory, scrubbed of secrets.
"""

import argparse
import json
import os
import re
import shlex
import sys
import time

from . import metrics, report, secrets, show

CLEAN, ERROR, DRIFT, ORPHANS, UNREACHABLE = 0, 1, 2, 3, 4
CONTAINERS_GROUP = 'gpufleet_running'  # the group the gpu_container role adds the running containers to
PLAYBOOKS = {'up': 'gpufleet.proxmox.site', 'drift': 'gpufleet.proxmox.drift', 'verify': 'gpufleet.proxmox.verify',
             'doctor': 'gpufleet.proxmox.doctor', 'driver-upgrade': 'gpufleet.proxmox.driver_upgrade',
             'rollback': 'gpufleet.proxmox.rollback'}
RESULT = 'result.json'  # a run's result in its artifacts
KEEP_RUNS = 20


def default_home():
    state = os.environ.get('XDG_STATE_HOME') or os.path.join(os.path.expanduser('~'), '.local', 'state')
    return os.environ.get('GPUFLEET_HOME') or os.path.join(state, 'gpufleet')


def private_dir(path):
    """path made (or kept) with mode 0700."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def ansible_options(args):
    """The options that ansible and ansible-playbook share: inventories, extra vars, the vault password file."""
    out = []
    for inv in args.inventory or []:
        out += ['-i', os.path.abspath(inv) if os.path.exists(inv) else inv]
    for extra in args.extra_vars or []:
        out += ['-e', extra]
    if args.vault_password_file:
        out += ['--vault-password-file', os.path.abspath(os.path.expanduser(args.vault_password_file))]
    return out


def playbook_options(args, command):
    """ansible-playbook's options for command's playbook: ansible_options, and a check run for drift without --fix
    (with --fix, a plain run: it repairs), the version and the check of a driver upgrade, a rollback's container and
    snapshot."""
    out = ansible_options(args)
    if command == 'drift' and not getattr(args, 'fix', False):
        out += ['--check', '--diff']
    if command == 'driver-upgrade':
        out += (['-e', 'gpu_node_driver_version=' + args.version] if args.version else []) + (
            ['--check'] if args.check else [])
    if command == 'rollback':
        out += ['-e', 'gpufleet_rollback_vmid={0}'.format(args.vmid)] + (
            ['-e', 'gpufleet_rollback_snapshot=' + args.snapshot] if args.snapshot else [])
    return out


def bin_dir():
    return os.path.dirname(os.path.abspath(sys.executable))


def gather_secrets(args, env):
    """Every secret value this run may meet (see secrets.py); a warning when the inventory could not say."""
    values = secrets.named_secrets(os.environ.items()) + secrets.extra_var_secrets(args.extra_vars or [])
    if args.vault_password_file:
        path = os.path.expanduser(args.vault_password_file)
        if os.path.isfile(path) and not os.access(path, os.X_OK):
            with open(path) as fh:
                values.append(fh.read().strip())
    ansible = os.path.join(bin_dir(), 'ansible')
    found, error = secrets.inventory_secrets([ansible if os.path.exists(ansible) else 'ansible']
                                             + ansible_options(args), env=env)
    return values + found, error


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def host_stats(stats):
    """ansible-runner's stats ({kind: {host: n}}) per host."""
    hosts = {}
    for kind, key in (('ok', 'ok'), ('changed', 'changed'), ('failures', 'failures'), ('dark', 'unreachable'),
                      ('skipped', 'skipped')):
        for host, n in ((stats or {}).get(kind) or {}).items():
            hosts.setdefault(host, {'ok': 0, 'changed': 0, 'failures': 0, 'unreachable': 0, 'skipped': 0})[key] = n
    return hosts


def drop_codes(codes, drop):
    """The exit-code lines of the module's doc without those of the codes in drop (their continuation lines too)."""
    out, skipping = [], False
    for line in codes.split('\n'):
        code = line[:6].strip()
        if code:
            skipping = code in drop
        if not skipping:
            out.append(line)
    return '\n'.join(out)


def outcome(command, fix, runner_status, rc, stats, verified, drift):
    """The run's result from what ansible-runner and the reports say: rows per container, exit code, verdict.

    verified is the fleet's verdict (summary.json of this run): a row for every container of the fleet definition,
    reached or not. The run is clean only when it verified every one of them."""
    hosts = host_stats(stats)
    containers = {}
    for row in (verified or {}).get('containers') or []:
        containers[row['host']] = dict(row, drift=[])
    for host, items in ((drift or {}).get('containers') or {}).items():
        containers.setdefault(host, {'host': host, 'ok': None})['drift'] = items
    nodes = dict((h, items) for h, items in ((drift or {}).get('nodes') or {}).items() if items)
    unreachable = sorted(h for h, s in hosts.items() if s['unreachable'])
    failed = sorted(h for h, s in hosts.items() if s['failures'])
    drift_found = bool((drift or {}).get('drift'))
    count, waiting = (drift or {}).get('count', 0), (drift or {}).get('waiting', 0)
    orphans = (drift or {}).get('orphans') or []
    left = ('; {0} orphan(s) left alone ({1}): containers that carry the fleet\'s tag outside its definition, their '
            'GPUs held'.format(len(orphans), ', '.join(orphans))) if orphans else ''
    waits = ', '.join((drift or {}).get('waiting_hosts') or [])
    # the node findings a run does not mend: the operator's (their lines say the fix)
    yours, mine = (drift or {}).get('yours', 0), ', '.join((drift or {}).get('yours_hosts') or [])
    judged = (verified or {}).get('expected') is not None
    fleet = 'verified {0} of {1} container(s)'.format((verified or {}).get('verified', 0), (verified or {}).get('expected'))
    if unreachable:
        code, verdict = UNREACHABLE, 'unreachable: ' + ', '.join(unreachable)
    elif failed or rc != 0 or stats is None:
        code = ERROR
        verdict = 'error: ' + ('failed on ' + ', '.join(failed) if failed else
                               'ansible-playbook exited {0} ({1})'.format(rc, runner_status))
        if judged and not verified.get('ok'):
            verdict += '; ' + verified['verdict']
    elif drift_found and fix:
        code, verdict = DRIFT, 'drift: {0} item(s) repaired'.format(count - waiting - yours)
        if yours:
            verdict += '; {0} left for you to fix, as their lines say ({1})'.format(yours, mine)
        if waiting:
            verdict += ('; {0} wait for a restart ({1}), which takes the changes written: restart when their jobs '
                        'allow, or let a run do it (restart_on_pending)'.format(waiting, waits))
        verdict += ', and the fleet verified' + (' as it runs now' if waiting else '') + left
    elif drift_found:
        code, verdict = DRIFT, 'drift: {0} item(s) found'.format(count)
        if count > waiting + yours:
            verdict += '; `gpufleet drift --fix` repairs {0}'.format(
                'them' if not waiting + yours else '{0} of them'.format(count - waiting - yours))
        if yours:
            verdict += '; {0} for you to fix, as their lines say ({1})'.format(yours, mine)
        if waiting:
            verdict += ('; {0} take effect only when {1} restart(s): restart when their jobs allow, or let a run do it '
                        '(restart_on_pending)'.format(waiting, waits))
        verdict += left
    elif not judged:
        code, verdict = ERROR, 'error: the run wrote no verdict on the fleet (its summary.json is missing or unjudged)'
    elif not verified.get('ok'):
        code, verdict = ERROR, 'error: ' + verified['verdict']
    else:
        code = ORPHANS if orphans else CLEAN
        verdict = 'clean: {0}{1}{2}'.format(fleet, ', no drift' if command == 'drift' else '', left)
    return {'command': command + (' --fix' if fix else ''), 'exit_code': code, 'verdict': verdict,
            'status': runner_status, 'rc': rc, 'drift': drift_found, 'drift_count': count, 'hosts': hosts,
            'nodes': nodes, 'containers': [containers[h] for h in sorted(containers)]}


def doctor_outcome(runner_status, rc, stats, report):
    """gpufleet doctor's result from its report (doctor.json of this run): ready (0) when every check is, else not
    ready (1), the checks that are not and their fixes in the rows."""
    hosts = host_stats(stats)
    if not isinstance(report, dict) or 'rows' not in report:
        code, verdict, rows = ERROR, 'error: the doctor wrote no verdict (ansible-playbook exited {0}, {1})'.format(
            rc, runner_status), []
    else:
        rows = report['rows']
        failing = [r for r in rows if not r['ok']]
        if report.get('ready') and not failing:
            code, verdict = CLEAN, 'ready: {0} check(s) passed; a first run (gpufleet up) can start'.format(len(rows))
        else:
            code = ERROR
            verdict = 'not ready: {0} of {1} check(s) failed ({2})'.format(
                len(failing), len(rows), ', '.join(sorted(set('{0} {1}'.format(r['where'], r['check']) for r in failing))))
    return {'command': 'doctor', 'exit_code': code, 'verdict': verdict, 'status': runner_status, 'rc': rc,
            'hosts': hosts, 'checks': rows, 'containers': [], 'nodes': {}, 'drift': False, 'drift_count': 0}


def upgrade_outcome(check, runner_status, rc, stats, reports, failures=()):
    """gpufleet driver-upgrade's result: each node's row and state as the collection judges them from its report
    (_verdict.upgrade), the exit code from those and ansible-runner's stats. Where no node was planned (a version
    refused, say), the verdict is the failed tasks' messages (failures)."""
    from gpufleet.profiles import collection_dists
    collection_dists()  # the collection on the path
    from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _verdict
    hosts = host_stats(stats)
    judged = _verdict.upgrade(reports, check)
    rows, by, version, said = judged['rows'], judged['by'], judged['version'], judged['said']
    unreachable = sorted(h for h, s in hosts.items() if s['unreachable'])
    failed = sorted(h for h, s in hosts.items() if s['failures'])
    if unreachable:
        code, verdict = UNREACHABLE, 'unreachable: ' + ', '.join(unreachable)
    elif by.get('failed') or failed or rc != 0 or stats is None or not rows:
        code = ERROR
        verdict = 'error: ' + (said or '; '.join(sorted(set(failures))) or 'ansible-playbook exited {0} ({1})'.format(
            rc, runner_status))
    else:
        code, verdict = CLEAN, '{0} {1}'.format('plan for' if check else 'driver', version) + ': ' + said
    return {'command': 'driver-upgrade' + (' --check' if check else ''), 'exit_code': code, 'verdict': verdict,
            'status': runner_status, 'rc': rc, 'hosts': hosts, 'upgrade': rows, 'containers': [], 'nodes': {},
            'drift': False, 'drift_count': 0}


def read_reports(directory):
    """{name: data} of the JSON reports in directory ({} where there is none)."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith('.json'))
    except OSError:
        return {}
    return dict((n[:-len('.json')], read_json(os.path.join(directory, n)) or {}) for n in names)


PREFORK = 'gpufleet.proxmox.prefork'
PREFORK_NAMES = (PREFORK, 'gpufleet.proxmox.gc_freeze')  # its former name too


def ansible_settings():
    """The Ansible settings the CLI hands ansible-runner: host key checking as this directory's ansible.cfg and the
    environment set it ('True' unless they turn it off; ansible-runner turns it off for every run it starts unless
    told); where neither sets pipelining (the collection installed, run outside a checkout), pipelining on, so
    that each module goes into a container in one round trip through pct, as the checkout's ansible.cfg has it; and
    the collection's prefork callback added to the callbacks they enable (it spares each forked worker a walk of
    the controller's objects and loading the plugins every worker uses), as the checkout's ansible.cfg has it."""
    from ansible.config.manager import ConfigManager
    config = ConfigManager()
    out = {'ANSIBLE_HOST_KEY_CHECKING': str(bool(config.get_config_value('HOST_KEY_CHECKING')))}
    if config.get_config_value_and_origin('ANSIBLE_PIPELINING')[1] == 'default':
        out['ANSIBLE_PIPELINING'] = 'True'
    enabled = list(config.get_config_value('CALLBACKS_ENABLED') or [])
    if not set(enabled) & set(PREFORK_NAMES):
        out['ANSIBLE_CALLBACKS_ENABLED'] = ','.join(enabled + [PREFORK])
    return out


def known_cause(said, args, limit):
    """What stopped a run, in words that say what to do, where Ansible's output (said) shows a cause a newcomer meets:
    a vaulted inventory without its password, a --node or --limit that matches no host; else None."""
    if 'no vault secrets' in said or 'Attempting to decrypt but no vault secrets found' in said:
        return ('the inventory holds vaulted values and no vault password was given: add --vault-password-file FILE '
                '(or set ANSIBLE_VAULT_PASSWORD_FILE)')
    # Ansible only warns "Could not match supplied host pattern" for a name it lacks: a container that joins the
    # inventory during the run (--limit pve1,train-0) is such a name. No host at all to start with stops the run.
    if 'leaves us with no hosts to target' in said:
        if getattr(args, 'node', None):
            return '--node {0}: no such node in the inventory\'s pve_nodes (ansible-inventory --graph pve_nodes lists ' \
                   'them)'.format(', '.join(args.node))
        return '--limit {0} matches no host of the inventory (ansible-inventory --graph lists them)'.format(limit)
    return None


def node_limit(nodes, group=CONTAINERS_GROUP):
    """--node: the host pattern of those nodes and their containers (the gpu_container role puts a node's running
    containers in <group>_<node>, its name's other characters as _), which join the inventory during the run."""
    return ','.join('{0},{1}_{2}'.format(node, group, re.sub(r'[^A-Za-z0-9_]', '_', node)) for node in nodes)


def this_run(summary, ident):
    """A report of this run (its run.id is ident), else None: the CLI never reads another run's verdict."""
    return summary if isinstance(summary, dict) and (summary.get('run') or {}).get('id') == ident else None


def run(args):
    """up, drift, verify, doctor: the run, its result printed (JSON with --json, else a table), its exit code."""
    result = execute(args)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        show.render(result)
    return result['exit_code']


def execute(args, command=None):
    """Run the command's playbook (command: args.command's unless given) through ansible-runner, with live progress
    unless args.json; its result (outcome's or doctor_outcome's, with the run's artifacts, reports, start and end),
    scrubbed of secrets and kept as result.json in the run's artifacts, where `gpufleet report` finds it."""
    import ansible_runner

    command = command or args.command
    if getattr(args, 'metrics', None):
        where = os.path.dirname(os.path.abspath(args.metrics))
        if not os.path.isdir(where) or not os.access(where, os.W_OK):
            raise SystemExit(show.error_text('--metrics {0}: {1} is not a directory this user can write to; make it '
                                             '(mkdir -p {1}) or name a file in one'.format(args.metrics, where)))
    os.umask(0o077)
    started = time.time()
    home = private_dir(os.path.abspath(os.path.expanduser(args.artifacts or default_home())))
    ident = '{0}-{1}-{2}'.format(time.strftime('%Y%m%dT%H%M%S'), command, os.getpid())
    reports = os.path.join(home, 'artifacts', ident, 'reports')
    env = dict(os.environ, PATH=bin_dir() + os.pathsep + os.environ.get('PATH', ''), GPUFLEET_REPORT_DIR=reports,
               GPUFLEET_RUN_ID=ident)
    values, error = gather_secrets(args, env)
    scrubber = secrets.Scrubber(values)
    if error:
        show.warn('the inventory\'s secret variables could not be read, so only the environment\'s, '
                  '-e\'s and the vault password are scrubbed: ' + scrubber.text(error))
    fix = getattr(args, 'fix', False)
    limit = node_limit(args.node) if args.node else args.limit
    cmdline = playbook_options(args, command)
    progress = show.Progress(scrubber.text, verbose=args.verbose, quiet=args.json)
    with progress:
        r = ansible_runner.run(
            private_data_dir=home, project_dir=os.getcwd(), ident=ident, playbook=PLAYBOOKS[command],
            cmdline=shlex.join(cmdline), limit=limit, forks=args.forks, verbosity=args.verbose or None,
            envvars=dict(ansible_settings(), PATH=env['PATH'], GPUFLEET_REPORT_DIR=reports, GPUFLEET_RUN_ID=ident),
            quiet=True,
            event_handler=progress.event, rotate_artifacts=KEEP_RUNS, suppress_env_files=True)
    ended = time.time()
    if command == 'doctor':
        result = doctor_outcome(r.status, r.rc, r.stats, read_json(os.path.join(reports, 'doctor.json')))
    elif command == 'driver-upgrade':
        result = upgrade_outcome(args.check, r.status, r.rc, r.stats,
                                 read_reports(os.path.join(reports, 'driver-upgrade')), progress.failures)
    else:
        summary = this_run(read_json(os.path.join(reports, 'summary.json')), ident)
        result = outcome(command, fix, r.status, r.rc, r.stats, summary,
                         read_json(os.path.join(reports, 'drift', 'summary.json')))
        result['node_info'] = (summary or {}).get('nodes') or {}
        if command == 'rollback' and result['exit_code'] == ERROR and progress.failures and not summary:
            # refused before the verification ran (no such container or snapshot): PVE's or the module's words
            result['verdict'] = 'error: ' + '; '.join(sorted(set(progress.failures)))
    said = ''.join(r.stdout.readlines())
    why = known_cause(said, args, limit)
    if why:
        result['verdict'] = 'error: ' + why
        result['exit_code'] = result['exit_code'] or ERROR
    elif r.stats is None:
        tail = scrubber.text('\n'.join(said.splitlines()[-20:]))
        show.error('ansible-playbook did not run its plays:\n' + tail)
    artifacts = os.path.join(home, 'artifacts', ident)
    result.update(artifacts=artifacts, reports=reports, started=round(started, 3), ended=round(ended, 3))
    # This run's files only: the runs before it were scrubbed when they ended. Anything ansible-runner put
    # beside the runs (inputs under the private directory) is scrubbed too.
    scrubber.tree(artifacts)
    for name in os.listdir(home):
        if name != 'artifacts':
            scrubber.tree(os.path.join(home, name))
    # What is printed, as a table or as JSON, is this one scrubbed result.
    result = json.loads(scrubber.text(json.dumps(result, default=str)))
    result['scrubbed'] = scrubber.count
    if getattr(args, 'metrics', None):
        try:
            result['metrics'] = metrics.write(args.metrics, result, metrics.command_label(command, fix), started, ended)
        except (IOError, OSError) as e:
            show.error('the metrics could not be written to {0}: {1}'.format(args.metrics, e))
            result['exit_code'] = result['exit_code'] or ERROR
    os.makedirs(artifacts, exist_ok=True)  # ansible-runner makes it, unless it could not start at all
    with open(os.path.join(artifacts, RESULT), 'w') as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
    return result


def add_parsers(sub):
    """The up, drift, verify, doctor and report subcommands with their common options."""
    common = dict(
        inventory=(('-i', '--inventory'), dict(action='append', metavar='INVENTORY',
                                               help='inventory path (repeatable); default: ansible.cfg\'s')),
        limit=(('--limit', '-l'), dict(help="Ansible's host pattern limit (nodes and containers)")),
        node=(('--node',), dict(action='append', metavar='NODE',
                                help='only this node and its containers (repeatable; instead of --limit)')),
        forks=(('--forks', '-f'), dict(type=int, help='parallel hosts (default: ansible.cfg\'s)')),
        extra_vars=(('-e', '--extra-vars'), dict(action='append', metavar='VARS',
                                                 help='extra variables, key=value, JSON or @file (repeatable)')),
        vault_password_file=(('--vault-password-file',), dict(metavar='FILE')),
        json=(('--json',), dict(action='store_true', help='print the result as JSON (no live progress)')),
        verbose=(('-v', '--verbose'), dict(action='count', default=0,
                                           help="show Ansible's output (-vvvv for everything), scrubbed")),
        artifacts=(('--artifacts',), dict(metavar='DIR', help='where runs are kept, mode 0700 '
                                          '(default $GPUFLEET_HOME or ~/.local/state/gpufleet)')))
    helps = {'up': 'provision: site.yml (nodes, containers, drivers, venvs, verification)',
             'drift': 'report drift (check mode); --fix repairs it and verifies',
             'verify': 'verify every container (read only)',
             'doctor': 'before a first run: check SSH, pct, the API logins, nodes, templates, storage, drivers and '
                       'packages, and what a run would change; each failing check with its fix (changes nothing)',
             'driver-upgrade': "roll the nodes' NVIDIA driver (gpu_node_driver_version, or --version) one node at a "
                               'time: each node\'s GPU containers stopped, the driver installed and built for its '
                               'kernels, the node rebooted, its containers started and verified; --check says what '
                               'it would do',
             'rollback': "roll one container back to one of its PVE snapshots (the collection's newest, "
                         'gpufleet-<date>-<time>, unless SNAPSHOT is named), start it, and verify the fleet',
             'report': 'the fleet as one HTML page (--html FILE): each node\'s GPUs and who holds them, each '
                       'container\'s versions, verdict and drift; from the last run, or from a drift check now (-i); '
                       'without --html, the run\'s table and each node\'s GPUs with their holders or free (--json: '
                       'as JSON)'}
    codes = __doc__.split('\n\n')[1]
    for name in ('up', 'drift', 'verify', 'doctor', 'driver-upgrade', 'rollback', 'report'):
        # only drift runs write a drift report: up and verify never exit 2
        own = codes if name == 'drift' else drop_codes(codes, ('2', '3'))
        if name == 'doctor':
            own = ('    0  ready: every check passed\n    1  not ready (a check failed; each says its fix), or the doctor '
                   'could not run')
        if name == 'report':
            own = '    0  the page was written (or the table shown)\n    1  no run to report on'
        if name == 'driver-upgrade':
            own = ('    0  every node is on the version (or, with --check, the plan was made)\n    1  a node failed '
                   '(the roll stopped there; its report says why and the way back), or the run could not start\n'
                   '    4  hosts unreachable')
        p = sub.add_parser(name, help=helps[name], description=helps[name] + '.\n\nexit codes:\n' + own,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        scope = p.add_mutually_exclusive_group()  # --node is a --limit spelled by node
        for dest, (flags, kw) in common.items():
            (scope if dest in ('limit', 'node') else p).add_argument(*flags, dest=dest, **kw)
        if name == 'drift':
            p.add_argument('--fix', action='store_true', help='repair the drift (a plain drift.yml run)')
        if name == 'rollback':
            p.add_argument('vmid', type=int, metavar='CT', help='the container (its vmid)')
            p.add_argument('snapshot', nargs='?', metavar='SNAPSHOT', help="the snapshot (default: the collection's "
                           'newest)')
        if name == 'driver-upgrade':
            p.add_argument('--version', help='the NVIDIA driver version (default: the inventory\'s '
                           'gpu_node_driver_version)')
            p.add_argument('--check', action='store_true', help='say what the roll would do on each node, changing '
                           'nothing')
        if name in ('up', 'drift', 'verify'):
            p.add_argument('--metrics', metavar='FILE', help='write the fleet\'s metrics to FILE for node_exporter\'s '
                           'textfile collector (Prometheus text format, replaced atomically; docs/operators.md)')
        if name == 'report':
            p.add_argument('--html', metavar='FILE', help='write the page to FILE (without it, the run\'s table)')
            p.set_defaults(func=report.command)
            continue
        p.set_defaults(func=run)
