# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one PVE API client of the collection: login, errors, tasks, locks (its connection options are _pve_options').

Every module that talks to the PVE API builds a `PveClient` from its parameters; it needs proxmoxer, not Ansible.  Errors come
out as `PveError` with PVE's own message (the HTTP reason phrase), the per-field errors of a
400, and for a failed task its exit status and the last lines of its log.
"""


import re
import time
import traceback

try:
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import ResourceException
    from requests.exceptions import ConnectionError as NoAnswer, Timeout as NoAnswerInTime
    HAS_PROXMOXER = True
    PROXMOXER_IMPORT_ERROR = None
except ImportError:
    HAS_PROXMOXER = False
    PROXMOXER_IMPORT_ERROR = traceback.format_exc()


def missing_proxmoxer():
    """A module's failure where its Python lacks proxmoxer (None where it has it), saying where to install it."""
    if HAS_PROXMOXER:
        return None
    import platform
    import sys
    return {'failed': True, 'exception': PROXMOXER_IMPORT_ERROR,
            'msg': "Failed to import the required Python library (proxmoxer) on {0}'s Python {1}: install proxmoxer "
                   "and requests there, or set ansible_python_interpreter to a Python that has them".format(
                       platform.node(), sys.executable)}


def pve_version(text):
    """(major, minor) of a PVE version string as /version gives it ('9.0.10'); (0, 0) where it is not one."""
    m = re.match(r'^(\d+)\.(\d+)', str(text or ''))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


HTTP_TIMEOUT = 60
TASK_LOG_LINES = 20
LOCK_MARKERS = ('CT is locked', "can't lock file", 'VM is locked')


def locked(message):
    """Is this PVE's answer for a guest that is locked ("CT is locked (backup)", "can't lock file ... got timeout";
    pve-guest-common src/PVE/AbstractConfig.pm check_lock, pve-common src/PVE/Tools.pm lock_file)?"""
    return any(m in message for m in LOCK_MARKERS)


class PveError(Exception):
    """A PVE answer that ends the module: message, HTTP status, per-field errors, task log lines."""

    def __init__(self, message, status=None, errors=None, log=None):
        super(PveError, self).__init__(message)
        self.message = message
        self.status = status
        self.errors = errors or {}
        self.log = log or []

    def result(self):
        out = {'msg': self.message}
        if self.status:
            out['status_code'] = self.status
        if self.errors:
            out['errors'] = self.errors
        if self.log:
            out['task_log'] = self.log
        return out


def _translate(err, what):
    """A proxmoxer ResourceException as PveError: PVE puts its message in the reason phrase."""
    reason = getattr(err, 'content', None) or str(err)
    errors = getattr(err, 'errors', None) or {}
    msg = '{0}: {1} {2}'.format(what, err.status_code, reason)
    if errors:
        msg += ' ' + '; '.join('{0}: {1}'.format(k, v) for k, v in sorted(errors.items()))
    return PveError(msg, status=err.status_code, errors=errors)


def use_token(params, read_only=False):
    """Whether a run logs in with the API token rather than the password, where it has both: a run that changes
    nothing (check mode, reads) uses the token, so that drift checks and verification need no password; a run that
    changes things uses the password (devN needs root@pam with it; PVE refuses it to every token). With one of the
    two, that one."""
    if not params.get('api_token_id'):
        return False
    return read_only or not params.get('api_password')


class PveClient(object):
    def __init__(self, params, read_only=False):
        self.params = params
        self.user = params['api_user']
        self.token = params.get('api_token_id') if use_token(params, read_only) else None
        verify = params['validate_certs']
        if verify and params.get('ca_path'):
            verify = params['ca_path']
        auth = dict(user=self.user)
        if self.token:
            auth.update(token_name=self.token, token_value=params['api_token_secret'])
        else:
            auth.update(password=params['api_password'])
            if params.get('api_otp'):
                auth.update(otp=params['api_otp'])
        self.task_timeout = params.get('timeout') or 300
        self.requests = 0
        hosts = params['api_host'] if isinstance(params['api_host'], list) else [params['api_host']]
        silent = []  # (url, why) of each node that did not answer
        for host in hosts:
            try:
                self.api = self._login(host, verify, auth, probe=len(hosts) > 1)
                self.host = host
                return
            except (NoAnswer, NoAnswerInTime) as e:  # this node does not answer: the next one may
                silent.append(('https://{0}:{1}'.format(host, params['api_port']), str(e)))
        if len(silent) == 1:
            raise PveError('cannot log in to the PVE API at {0} as {1}: {2}'.format(silent[0][0], self.user, silent[0][1]))
        raise PveError('cannot log in to the PVE API as {0}: no node of api_host answers: {1}'.format(
            self.user, '; '.join('{0} ({1})'.format(url, why) for url, why in silent)))

    def _login(self, host, verify, auth, probe=False):
        """The API at host, logged in (with a token, which needs no login, probe asks /version to know that the
        node answers). A node that does not answer raises requests' ConnectionError or Timeout."""
        params = self.params
        try:
            api = ProxmoxAPI(host, port=params['api_port'], verify_ssl=verify, timeout=HTTP_TIMEOUT, service='PVE',
                             **auth)
            if not self.token:
                self.requests += 1  # the ticket
            elif probe:
                self.requests += 1
                api.version.get()
            return api
        except (NoAnswer, NoAnswerInTime):
            raise
        except ResourceException as e:
            raise _translate(e, 'login to {0} as {1}'.format(host, self.user))
        except Exception as e:  # requests' SSL errors, proxmoxer's AuthenticationError
            why = str(e)
            if 'Two Factor' in why:  # PVE answered the password with NeedTFA (a second factor is configured)
                why = ('{0} has two-factor authentication and {1}: give api_otp (gpufleet_api_otp) a current '
                       'one-time code for this run'.format(
                           self.user, 'the code in api_otp was refused' if params.get('api_otp') else 'no code was given'))
            raise PveError('cannot log in to the PVE API at https://{0}:{1} as {2}: {3}'.format(
                host, params['api_port'], self.user, why))

    # -- authentication facts ------------------------------------------------------
    @property
    def is_root_password(self):
        """True only for root@pam logged in with its password: what PVE needs for devN."""
        return self.user == 'root@pam' and not self.token

    def auth_label(self):
        return '{0}!{1} (API token)'.format(self.user, self.token) if self.token else self.user

    # -- requests --------------------------------------------------------------------
    def call(self, method, path, **params):
        """One API request: method GET/POST/PUT/DELETE on path ('nodes/pve/lxc/100/config')."""
        self.requests += 1
        try:
            res = getattr(self.api(path), method.lower())(**params)
        except ResourceException as e:
            raise _translate(e, '{0} {1}'.format(method, '/' + path.lstrip('/')))
        except Exception as e:
            raise PveError('{0} /{1}: {2}'.format(method, path.lstrip('/'), e))
        return res

    def get(self, path, **params):
        return self.call('GET', path, **params)

    def mutate(self, method, path, lock_timeout=60, **params):
        """A change, retried with backoff while the guest is locked; then fails naming the lock."""
        delay, started = 0.25, time.time()
        while True:
            try:
                return self.call(method, path, **params)
            except PveError as e:
                waited = time.time() - started
                if not locked(e.message) or waited >= lock_timeout:
                    if locked(e.message):
                        e.message = '{0} (still locked after {1:.0f} s of retries)'.format(e.message, waited)
                    raise
            time.sleep(min(delay, max(lock_timeout - (time.time() - started), 0) + 0.01))
            delay = min(delay * 2, 5.0)

    # -- tasks --------------------------------------------------------------------------
    def wait_task(self, node, upid, what):
        """Wait for a task; a failed one raises with PVE's exit status and the last log lines."""
        deadline = time.time() + self.task_timeout
        delay = 0.02
        while True:
            status = self.get('nodes/{0}/tasks/{1}/status'.format(node, upid))
            if status.get('status') == 'stopped':
                break
            if time.time() > deadline:
                raise PveError('{0}: task {1} still running after {2} s'.format(what, upid, self.task_timeout))
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)
        exitstatus = status.get('exitstatus', '')
        if exitstatus == 'OK' or exitstatus.startswith('WARNINGS'):
            return status
        log = self.get('nodes/{0}/tasks/{1}/log'.format(node, upid), start=0, limit=100000)
        lines = [entry.get('t', '') for entry in log][-TASK_LOG_LINES:]
        raise PveError('{0} failed: {1}'.format(what, exitstatus), log=lines)

    def run_task(self, method, path, node, what, lock_timeout=60, accepted=None, **params):
        """A change that runs as a task, waited for. While the guest is locked it is retried, for lock_timeout
        seconds in all: the request, and the task where PVE checks the lock inside it (a start, stop, shutdown
        or reboot checks it in its worker: pve-container src/PVE/API2/LXC/Status.pm, check_lock of
        pve-guest-common src/PVE/AbstractConfig.pm). accepted() is called once PVE has taken the request."""
        delay, started = 0.25, time.time()
        while True:
            left = max(lock_timeout - (time.time() - started), 0)
            upid = self.mutate(method, path, lock_timeout=left, **params)
            if accepted is not None:
                accepted()
            try:
                return self.wait_task(node, upid, what)
            except PveError as e:
                waited = time.time() - started
                if not locked(e.message) or e.status:
                    raise
                if waited >= lock_timeout:
                    e.message = '{0} (still locked after {1:.0f} s of retries)'.format(e.message, waited)
                    raise
            time.sleep(min(delay, max(lock_timeout - (time.time() - started), 0) + 0.01))
            delay = min(delay * 2, 5.0)

    # -- cluster -------------------------------------------------------------------------
    def version(self):
        """The version of the node that answers the API."""
        return self.get('version')

    def nodes(self):
        """The names of the cluster's nodes, sorted."""
        return sorted(n['node'] for n in self.get('nodes'))

    def node_version(self, node):
        """A node's own version (pve-manager PVE/API2/Nodes.pm 'version': proxied to that node)."""
        return self.get('nodes/{0}/version'.format(node))

    def guests(self):
        """Every guest of the cluster in one request: {vmid: resource}."""
        return dict((int(r['vmid']), r) for r in self.get('cluster/resources', type='vm'))
