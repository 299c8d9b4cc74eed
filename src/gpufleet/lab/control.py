"""A client for the lab daemon's control socket (tests and `gpufleet lab status` use it)."""

import http.client
import json
import socket

from .layout import Lab


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=30):
        super().__init__('lab', timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Control:
    def __init__(self, lab=None):
        self.lab = lab or Lab()
        self.path = self.lab.path('run', 'control.sock')

    def call(self, method, url, body=None):
        conn = _UnixConnection(self.path)
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, url, body=data, headers={'Content-Type': 'application/json'} if data else {})
            resp = conn.getresponse()
            text = resp.read().decode()
            if resp.status >= 400:
                raise OSError('lab control {0} {1}: {2} {3}'.format(method, url, resp.status, text))
            return json.loads(text) if text else None
        finally:
            conn.close()

    def get(self, url):
        return self.call('GET', url)

    def requests(self):
        """Every API request the fake has seen since the last clear: [method, path, body]."""
        return self.get('/requests')

    def mutating_requests(self):
        return [r for r in self.requests() if r[0] not in ('GET', 'HEAD') and not r[1].endswith('/access/ticket')]

    def clear_requests(self):
        return self.call('DELETE', '/requests')

    def fail(self, method, suffix, **kwargs):
        return self.call('POST', '/fail', dict(method=method, suffix=suffix, **kwargs))

    def clear_failures(self):
        return self.call('DELETE', '/fail')

    def lock(self, vmid, lock):
        return self.call('POST', '/lock', {'vmid': vmid, 'lock': lock})

    def state(self):
        return self.get('/state')

    def set_version(self, version, node=None):
        """Make every node run another PVE version (9.0.10 by default), or only `node` (a cluster half upgraded)."""
        return self.call('POST', '/version', dict({'version': version}, **({'node': node} if node else {})))

    def set_status_lag(self, seconds):
        """Make /cluster/resources show each container's status as it was this many seconds ago ('unknown' for
        one that did not exist then), as pvestatd's rounds do; 0 shows it as it is."""
        return self.call('POST', '/status_lag', {'seconds': seconds})

    def add_token(self, tokenid, secret, role, user='root@pam'):
        """An API token USER!TOKENID with privilege separation that holds role on '/' (PVEAuditor: read only)."""
        return self.call('POST', '/token', {'user': user, 'tokenid': tokenid, 'secret': secret, 'role': role})

    def set_tfa(self, on):
        """Give root@pam a second factor (its password login is answered with NeedTFA), or take it away."""
        return self.call('POST', '/tfa', {'on': bool(on)})
