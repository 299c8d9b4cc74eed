"""The lab's PVE API: TLS with certificate verification, both auth methods, permissions."""

import requests
import pytest
from proxmoxer.core import ResourceException

pytestmark = pytest.mark.lab


def url(creds, path):
    return 'https://{0}:{1}/api2/json{2}'.format(creds['api_host'], creds['api_port'], path)


def test_tls_is_verified_against_the_lab_ca(creds):
    # The lab CA verifies the server certificate ...
    r = requests.get(url(creds, '/version'), verify=creds['ca_path'], timeout=10)
    assert r.status_code == 401
    # ... and without it the certificate is refused: verification really is on.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url(creds, '/version'), verify=True, timeout=10)


def test_password_login_gives_ticket_and_csrf(creds):
    r = requests.post(url(creds, '/access/ticket'), verify=creds['ca_path'], timeout=10,
                      data={'username': 'root@pam', 'password': creds['api_password']})
    assert r.status_code == 200
    data = r.json()['data']
    assert data['username'] == 'root@pam'
    assert data['ticket'].startswith('PVE:root@pam:') and data['CSRFPreventionToken']
    v = requests.get(url(creds, '/version'), verify=creds['ca_path'], timeout=10,
                     cookies={'PVEAuthCookie': data['ticket']})
    assert v.status_code == 200 and v.json()['data']['version']


def test_wrong_password_is_refused(creds):
    r = requests.post(url(creds, '/access/ticket'), verify=creds['ca_path'], timeout=10,
                      data={'username': 'root@pam', 'password': creds['api_password'] + 'x'})
    assert r.status_code == 401


def test_api_token_authenticates(creds, pve_token):
    header = 'PVEAPIToken={0}!{1}={2}'.format(creds['api_user'], creds['api_token_id'], creds['api_token_secret'])
    r = requests.get(url(creds, '/nodes'), verify=creds['ca_path'], timeout=10, headers={'Authorization': header})
    assert r.status_code == 200
    assert [n['node'] for n in r.json()['data']] == [creds['node']]
    bad = requests.get(url(creds, '/nodes'), verify=creds['ca_path'], timeout=10,
                       headers={'Authorization': header[:-1] + ('0' if header[-1] != '0' else '1')})
    assert bad.status_code == 401
    assert pve_token.api.version.get()['version']


def test_template_is_on_local_storage(pve, creds):
    content = pve.n.storage('local').content.get(content='vztmpl')
    assert 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst' in [c['volid'] for c in content]


def test_the_template_the_api_lists_is_a_file_that_pvesm_path_names_on_the_node(node_ssh):
    # the path of the node's `local` (a dir storage: template/cache), and a real archive there with python3 in it
    volid = 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst'
    got = node_ssh('p=$(pvesm path {0}) && echo "$p" && tar -tf "$p"'.format(volid))
    assert got.returncode == 0, got.stderr
    path, files = got.stdout.splitlines()[0], got.stdout.splitlines()[1:]
    assert path.endswith('/storage/local/template/cache/debian-12-standard_12.12-1_amd64.tar.zst')
    assert './usr/bin/python3' in files and './etc/os-release' in files
    # PVE's errors, on stderr with exit 255: an unknown storage, a name that is no template, no volume id at all
    for volume, said in (('nfs1:vztmpl/x.tar.zst', "storage 'nfs1' does not exist"),
                         ('local:vztmpl/x.txt', "unable to parse directory volume name 'vztmpl/x.txt'"),
                         ('just-a-name', "unable to parse volume ID 'just-a-name'")):
        got = node_ssh('pvesm path {0}'.format(volume))
        assert (got.returncode, got.stdout, got.stderr.strip()) == (255, '', said)


def test_token_is_refused_device_passthrough_but_may_change_cores(pve, pve_token):
    pve.create(931)
    with pytest.raises(ResourceException) as err:
        pve_token.ct(931).config.put(dev0='path=/dev/nvidia0')
    assert err.value.status_code == 403
    assert 'device passthrough is only allowed for root@pam' in str(err.value)
    assert 'dev0' not in pve.ct(931).config.get()
    pve_token.ct(931).config.put(cores=2)
    assert pve.ct(931).config.get()['cores'] == 2


def test_unknown_template_fails_the_create_task(pve):
    upid = pve.n.lxc.post(vmid=932, ostemplate='local:vztmpl/nope-1.0.tar.zst', storage='local-lvm')
    st, log = pve.wait(upid)
    assert st['exitstatus'] != 'OK' and 'does not exist' in st['exitstatus']
    with pytest.raises(ResourceException):
        pve.ct(932).config.get()


def test_proxmoxer_password_and_token_see_the_same_cluster(creds, pve, pve_token):
    pve.create(933)
    by_password = {r['vmid'] for r in pve.api.cluster.resources.get(type='vm')}
    by_token = {r['vmid'] for r in pve_token.api.cluster.resources.get(type='vm')}
    assert 933 in by_password and by_password == by_token
