# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The container's own Python: every module the collection runs in a container needs it, and so does every venv
made from it. Where a module's call came back as output Ansible could not read (the interpreter missing, or one that
does not start), the container is asked, with a shell and no Python, what is wrong and how its distribution puts it
back (diagnose); a repair run puts it back with the container's own package manager (repair)."""


import os
import re
import shlex

# Asked in the container with sh (no Python): the interpreter's link and what it leads to, whether it starts, the
# packages that hold Python (dpkg's status of each), the distribution. The script is the gpu_container role's file,
# which the doctor runs too.
PROBE_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'roles',
                          'gpu_container', 'files', 'python-probe.sh')


def probe():
    with open(PROBE_FILE) as fh:
        return fh.read()


# The packages of Python in Debian and Ubuntu: what an install of python3 brings, and the per-version ones.
PYTHON_PACKAGE = re.compile(r'^(python3|python3-minimal|python3\.\d+|python3\.\d+-minimal|libpython3\.\d+-(?:minimal|stdlib))$')


def unreadable(result):
    """Whether a module's result is output Ansible could not read as a module's (what a container without a working
    Python gives: the interpreter not found, or an interpreter that dies before the module starts)."""
    return bool(result) and result.get('failed') and result.get('_ansible_parsed') is False


def interpreter_of(action, task_vars):
    """The Python the task's module ran with in the container (the one Ansible used, else the host's setting)."""
    used = getattr(action, '_used_interpreter', None)
    if used:
        return used.lstrip('#!').split()[0]
    return (task_vars or {}).get('ansible_python_interpreter') or '/usr/bin/python3'


def each(text):
    """The doctor's run of the probe over a node's running containers (each one's answer after a line '== <vmid>') as
    {vmid: its answer}."""
    out, vmid = {}, None
    for line in (text or '').splitlines():
        if line.startswith('== ') and line[3:].strip().isdigit():
            vmid = int(line[3:].strip())
            out[vmid] = ''
        elif vmid is not None:
            out[vmid] += line + '\n'
    return out


def parse(text, python):
    """The probe's answer as what it found: {python, exists, link, starts, version, message, packages: [installed
    Python packages], os}."""
    found = {'python': python, 'exists': False, 'link': None, 'starts': False, 'version': None, 'message': None,
             'packages': [], 'os': None}
    rc = None
    for line in (text or '').splitlines():
        key, _sep, value = line.partition('=')
        if key == 'link':
            found['link'] = value
        elif key == 'exists':
            found['exists'] = True
        elif key == 'rc':
            rc = value.strip()
        elif key == 'out':
            found['message'] = value.strip()
        elif key == 'pkg':
            name, _sp, status = value.partition(' ')
            if PYTHON_PACKAGE.match(name) and status.strip().startswith(('ii', 'iU', 'iF', 'iH')):
                found['packages'].append(name)
        elif key == 'os':
            found['os'] = value.strip()
    if found['exists'] and rc == '0' and re.match(r'^\d+\.\d+$', found['message'] or ''):
        found.update(starts=True, version=found['message'], message=None)
    return found


def finding(found):
    """The finding of a container's Python that is missing or does not start ({check, msg, fix, repair}, repair the
    command that puts it back), or None where it starts."""
    if found['starts']:
        return None
    python = found['python']
    if not found['exists']:
        msg = 'the container\'s Python {0} is missing{1}'.format(
            python, ' (a link to {0}, which is gone)'.format(found['link']) if found['link'] else '')
    else:
        msg = 'the container\'s Python {0} does not start: {1}'.format(python, found['message'] or 'no message')
    repair = None
    if found['packages'] or (found['os'] or '').split(' ')[0] in ('debian', 'ubuntu'):
        # the packages dpkg says are installed (their files may be gone), and python3 itself where it is not
        packages = ['python3'] + sorted(p for p in set(found['packages']) if p != 'python3')
        repair = 'apt-get install --reinstall -y ' + ' '.join(packages)
        fix = 'reinstall it in the container: {0} (gpufleet drift --fix does it)'.format(repair)
    else:
        fix = 'reinstall python3 in the container with its package manager'
    return {'check': 'container_python', 'msg': msg, 'fix': fix, 'repair': repair, 'found': found}


def diagnose(action, python):
    """What is wrong with the container's Python, asked over the task's connection with sh: its finding, or None
    where it starts (then the module failed for another reason)."""
    out = action._low_level_execute_command('/bin/sh -c {0} sh {1}'.format(shlex.quote(probe()), shlex.quote(python)),
                                            sudoable=True)
    return finding(parse(out.get('stdout'), python))


def repair(action, found, timeout=900):
    """The container's Python put back with found's repair command, run with sh over the task's connection (the
    package lists refreshed first where the install cannot find the packages). (ok, the output's last lines)."""
    if not found.get('repair'):
        return False, 'no repair is known for this container\'s distribution: {0}'.format(found['fix'])
    install = 'DEBIAN_FRONTEND=noninteractive timeout {0} {1}'.format(int(timeout), found['repair'])
    script = '{0} || {{ apt-get update -qq && {0}; }}'.format(install)
    out = action._low_level_execute_command('/bin/sh -c {0}'.format(shlex.quote(script)), sudoable=True)
    lines = ((out.get('stdout') or '') + '\n' + (out.get('stderr') or '')).strip().splitlines()
    return out.get('rc') == 0, '\n'.join(lines[-5:])


def result(found, check_mode, module):
    """A module call's result where the container's Python is missing or does not start: in check mode a finding a
    repair run acts on (changed, not failed: the rest of the run judges the container by it), else a failure."""
    msg = '{0}: {1}; fix: {2}'.format(module, found['msg'], found['fix'])
    if check_mode:
        return {'changed': True, 'container_python': found, 'msg': msg}
    return {'failed': True, 'container_python': found, 'msg': msg}
