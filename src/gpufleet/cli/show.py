"""What the CLI shows: live progress per host while a run goes, then a table per container."""

import sys

from rich.console import Console
from rich.live import Live
from rich.table import Table


class Progress:
    """Follows ansible-runner's events: per host, the task it is on and its ok/changed/failed counts.

    On a terminal it is a live table on stderr; elsewhere (cron, CI) each play and each failed or unreachable
    host is one line; with verbose it prints Ansible's own output instead, scrubbed of secrets."""

    def __init__(self, scrub, verbose=0, quiet=False, console=None):
        self.scrub = scrub
        self.verbose = verbose
        self.quiet = quiet
        self.console = console or Console(stderr=True, highlight=False)
        self.hosts = {}
        self.play = ''
        self.live = None
        self.failures = []  # the failed tasks' messages, scrubbed, each starting with its host

    def __enter__(self):
        if not self.quiet and not self.verbose and self.console.is_terminal:
            self.live = Live(self._table(), console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
        return False

    def _host(self, name):
        return self.hosts.setdefault(name, {'task': '', 'ok': 0, 'changed': 0, 'failed': 0, 'unreachable': 0})

    def _table(self):
        table = Table(title=self.play or 'starting', title_justify='left', expand=False)
        for col in ('host', 'task', 'ok', 'changed', 'failed'):
            table.add_column(col, justify='right' if col in ('ok', 'changed', 'failed') else 'left')
        for name in sorted(self.hosts):
            h = self.hosts[name]
            failed = '[red]{0}[/red]'.format(h['failed']) if h['failed'] else '0'
            task = '[red]unreachable[/red]' if h['unreachable'] else h['task']
            table.add_row(name, task, str(h['ok']), str(h['changed']), failed)
        return table

    def _say(self, text):
        if not self.quiet:
            self.console.print(self.scrub(text), markup=False, highlight=False, soft_wrap=True)

    def event(self, event):
        """ansible-runner's event_handler: update the view; always keep the event."""
        kind = event.get('event', '')
        data = event.get('event_data') or {}
        host = data.get('host')
        if self.verbose and event.get('stdout'):
            self._say(event['stdout'])
        if kind == 'playbook_on_play_start':
            self.play = data.get('play', '')
            if not self.live and not self.verbose:
                self._say('PLAY ' + self.play)
        elif host and kind == 'runner_on_start':
            self._host(host)['task'] = data.get('task', '')
        elif host and kind == 'runner_on_ok':
            self._host(host)['changed' if (data.get('res') or {}).get('changed') else 'ok'] += 1
        elif host and kind == 'runner_on_failed' and not data.get('ignore_errors'):
            self._host(host)['failed'] += 1
            msg = str((data.get('res') or {}).get('msg', ''))
            self.failures.append(self.scrub(msg if msg.startswith(host + ':') else '{0}: {1}'.format(host, msg)))
            if not self.live and not self.verbose:
                self._say('  failed: {0}: {1}: {2}'.format(host, data.get('task', ''),
                                                          (data.get('res') or {}).get('msg', '')))
        elif host and kind == 'runner_on_unreachable':
            self._host(host)['unreachable'] += 1
            if not self.live and not self.verbose:
                self._say('  unreachable: {0}: {1}'.format(host, (data.get('res') or {}).get('msg', '')))
        if self.live is not None:
            self.live.update(self._table())
        return True


def _devices(row):
    """The GPUs a container is given, and what torch saw of them where its verification counted them (CUDA required);
    a CPU torch, or a venv whose CUDA is not required, is said not to be checked."""
    gpus, seen, want = row.get('gpus'), row.get('devices_seen'), row.get('devices_expected')
    if gpus is None and seen is None and want is None:
        return '-'
    given = 'gpus {0}'.format(len(gpus) if gpus is not None else want if want is not None else '-')
    if want is not None:
        return '{0} (torch sees {1})'.format(given, '-' if seen is None else seen)
    if gpus and row.get('state') in ('verified', 'failed'):
        return '{0} (not counted: {1})'.format(given, 'a CPU torch' if not row.get('cuda_version') else
                                               'CUDA not required')
    return given


def drift_line(item):
    """One drift item (a container's or a node's) as a line: stage, item, detail, what it was and is to be (before
    and after, where the item has them), and its fix where it has one."""
    line = '{0} {1}: {2}'.format(item.get('stage', ''), item.get('item', ''), item.get('detail', '')).strip()
    if ('before' in item or 'after' in item) and item.get('item') not in ('power', 'removal'):
        line += ' ({0} -> {1})'.format(_shown(item.get('before')), _shown(item.get('after')))
    return line + (' (fix: {0})'.format(item['fix']) if item.get('fix') and item['fix'] != item.get('detail') else '')


def _shown(value):
    return 'none' if value is None else str(value)


def _drift_lines(row):
    return [drift_line(i) for i in row.get('drift') or []]


def _ok(row):
    """yes, no, or no with why where the container was not verified at all (missing, stopped, unreached)."""
    if row.get('ok') is None:
        return row.get('state') or '-'
    state = row.get('state')
    return 'yes' if row['ok'] else ('no ({0})'.format(state) if state not in (None, 'failed') else 'no')


def upgrade_line(row):
    """One node of a driver upgrade, in a line."""
    cts = ', '.join('CT {0}'.format(v) for v in row['containers']) or 'no GPU container'
    if row['state'] == 'planned':
        return '{0}: planned {1} -> {2}: {3}'.format(row['node'], row['from'], row['to'], '; '.join(
            '{0}. {1}'.format(i + 1, s) for i, s in enumerate(row['steps'])))
    if row['state'] == 'upgraded':
        return '{0}: upgraded {1} -> {2}, {3} verified (down {4} s)'.format(
            row['node'], row['from'], row['to'], cts, row['down_seconds'])
    if row['state'] == 'failed':
        return '{0}: FAILED: {1}'.format(row['node'], row['msg'])
    if row['state'] == 'not reached':
        return '{0}: not reached ({1} -> {2} waits for the node that failed)'.format(row['node'], row['from'], row['to'])
    if row['state'] == 'unchanged':
        return '{0}: on {1} already'.format(row['node'], row['to'])
    return '{0}: no NVIDIA driver loaded (no GPUs): nothing to upgrade'.format(row['node'])


def render_checks(rows, console):
    """The doctor's checks: a table on a terminal, a line each elsewhere (the fix under a failing one)."""
    if console.is_terminal:
        table = Table(title='checks', title_justify='left')
        for col in ('where', 'check', 'ok', 'detail / fix'):
            table.add_column(col)
        for r in rows:
            table.add_row(r['where'], r['check'], 'yes' if r['ok'] else '[red]NO[/red]',
                          r['detail'] + ('\n[bold]fix:[/bold] ' + r['fix'] if r['fix'] else ''))
        console.print(table)
        return
    for r in rows:
        console.print('{0} {1} {2}: {3}'.format('ok ' if r['ok'] else 'NOT', r['where'], r['check'], r['detail']),
                      markup=False, soft_wrap=True)
        if r['fix']:
            console.print('    fix: ' + r['fix'], markup=False, soft_wrap=True)


def render(result, console=None):
    """The end of a run on stdout: a table per container on a terminal, one line per container and per drift
    item elsewhere (logs, cron mail: each a line of its own, however long), then unreachable or failed hosts and the
    verdict; the doctor's checks."""
    console = console or Console(highlight=False)
    if 'checks' in result:
        render_checks(result['checks'], console)
        console.print(result['verdict'], markup=False, soft_wrap=True)
        return
    if 'upgrade' in result:
        for row in result['upgrade']:
            console.print(upgrade_line(row), markup=False, soft_wrap=True)
        console.print(result['verdict'], markup=False, soft_wrap=True)
        return
    rows = result['containers']
    if rows and console.is_terminal:
        table = Table(title='containers', title_justify='left')
        for col in ('container', 'node', 'vmid', 'torch', 'cuda', 'gpus', 'ok', 'drift'):
            table.add_column(col)
        for row in rows:
            table.add_row(row['host'], str(row.get('node') or '-'), str(row.get('vmid') or '-'),
                          row.get('torch_version') or '-', row.get('cuda_version') or '-', _devices(row),
                          _ok(row) if row.get('ok') is not False else '[red]{0}[/red]'.format(_ok(row)),
                          '\n'.join(_drift_lines(row)) or '-')
        console.print(table)
    else:
        for row in rows:
            console.print('{0} (node {1}, CT {2}): torch {3}, cuda {4}, {5}, ok {6}'.format(
                row['host'], row.get('node') or '-', row.get('vmid') or '-', row.get('torch_version') or '-',
                row.get('cuda_version') or '-', _devices(row), _ok(row)), markup=False, soft_wrap=True)
            for line in _drift_lines(row) + row.get('failures', []):
                console.print('  ' + line, markup=False, soft_wrap=True)
    for node, items in sorted(result.get('nodes', {}).items()):
        for i in items:
            console.print('node {0}: {1}'.format(node, drift_line(i)), markup=False, soft_wrap=True)
    for host, stats in sorted(result['hosts'].items()):
        if stats['unreachable'] or stats['failures']:
            console.print('{0}: {1}'.format(host, 'unreachable' if stats['unreachable'] else
                                            '{0} task(s) failed'.format(stats['failures'])), markup=False, soft_wrap=True)
    console.print(result['verdict'], markup=False, soft_wrap=True)


def error_text(message):
    return 'gpufleet: ' + message


def error(message):
    print(error_text(message), file=sys.stderr)


def warn(message):
    error('warning: ' + message)
