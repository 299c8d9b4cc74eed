"""inventories/lab/cluster.py, the lab's inventory script, run as Ansible runs it: what it gives every host."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, 'inventories', 'lab', 'cluster.py')


def listed(lab_dir):
    done = subprocess.run([sys.executable, SCRIPT, '--list'], env=dict(os.environ, GPUFLEET_LAB_DIR=str(lab_dir)),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_the_labs_directory_logins_and_other_nodes_are_values(tmp_path):
    logins = {'api_host': '127.0.0.1', 'api_port': 8006, 'api_password': 'secret', 'ca_path': '/x/ca.pem'}
    (tmp_path / 'credentials.json').write_text(json.dumps(logins))
    (tmp_path / 'nodes.json').write_text(json.dumps([{'name': 'pve1', 'ssh_port': 2201},
                                                     {'name': 'pve2', 'ssh_port': 2202}]))
    out = listed(tmp_path)
    assert out['all']['vars'] == {'gpufleet_lab_dir': str(tmp_path), 'gpufleet_lab': logins}
    assert out['pve_nodes']['hosts'] == ['pve2']  # pve1 is hosts.yml's
    pve2 = out['_meta']['hostvars']['pve2']
    assert pve2['ansible_port'] == 2202
    assert pve2['gpufleet_lab_node_dir'] == str(tmp_path / 'nodes' / 'pve2')
    assert pve2['ansible_ssh_private_key_file'] == str(tmp_path / 'ssh' / 'id_ed25519')
    assert str(tmp_path / 'ssh' / 'known_hosts') in pve2['ansible_ssh_common_args']
    assert '{{' not in json.dumps(out)  # nothing left for each task to evaluate again


def test_a_lab_that_is_not_up_gives_its_directory_and_no_logins(tmp_path):
    out = listed(tmp_path)
    assert out['all']['vars'] == {'gpufleet_lab_dir': str(tmp_path)}
    assert out['pve_nodes']['hosts'] == [] and out['_meta']['hostvars'] == {}
