"""Secrets out of what the CLI prints and keeps.

ansible-runner keeps the whole environment of a run (the `command` artifact), its command line and every
event.  Before a run the CLI learns the secret values it may meet: the fleet's API password and token secret
and Ansible's own passwords as the inventory resolves them (vault included), secret-named environment
variables and `-e` values, and the vault password.  Everything printed goes through `Scrubber.text`, and
after the run every file of the run's private directory is rewritten with each value masked.
"""

import base64
import json
import os
import re
import subprocess

import yaml

MASK = '********'
# The variables that hold secrets: the collection's API logins and Ansible's connection passwords.
SECRET_VARS = ('gpufleet_api_password', 'gpufleet_api_token_secret', 'gpufleet_api_otp', 'ansible_password',
               'ansible_ssh_pass', 'ansible_become_password', 'ansible_become_pass', 'ansible_pct_password')
SECRET_NAME = re.compile(r'(pass(word|wd)?|secret|token|private_key)$', re.IGNORECASE)
MIN_LEN = 4  # shorter values would mask ordinary words


def named_secrets(pairs):
    """Values of (name, value) pairs whose name says secret."""
    return [str(v) for k, v in pairs if SECRET_NAME.search(str(k)) and isinstance(v, (str, int)) and str(v)]


def extra_var_secrets(extra_vars):
    """Secret values given with -e: key=value pairs, JSON/YAML inline, or @files (vault files are skipped)."""
    out = []
    for arg in extra_vars:
        if arg.startswith('@'):
            try:
                with open(os.path.expanduser(arg[1:])) as fh:
                    text = fh.read()
            except OSError:
                continue
            if text.startswith('$ANSIBLE_VAULT'):
                continue
        else:
            text = arg
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            data = None
        if not isinstance(data, dict):
            data = dict(kv.split('=', 1) for kv in text.split() if '=' in kv)
        out += named_secrets(_walk(data))
    return out


def _walk(data):
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(v, (dict, list)):
                yield from _walk(v)
            else:
                yield k, v
    elif isinstance(data, list):
        for v in data:
            yield from _walk(v)


def inventory_secrets(ansible_argv, env=None):
    """The secret variables' values as the inventory resolves them for every host (templated, vault opened),
    through an ad hoc debug that connects to nothing.  Returns (values, error or None)."""
    names = ', '.join("'{0}'".format(n) for n in SECRET_VARS)
    expr = ('{{% set ns = namespace(v=[]) %}}{{% for n in [{0}] %}}'
            '{{% set ns.v = ns.v + [lookup("ansible.builtin.vars", n, default="") | string] %}}{{% endfor %}}'
            'GPUFLEET-SECRETS:{{{{ ns.v | to_json | b64encode }}}}').format(names)
    argv = ansible_argv + ['all:localhost', '-m', 'ansible.builtin.debug', '-a', 'msg=' + expr]
    env = dict(env if env is not None else os.environ, ANSIBLE_STDOUT_CALLBACK='ansible.builtin.default',
               ANSIBLE_NOCOLOR='1')
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], str(e)
    values = []
    for encoded in re.findall(r'GPUFLEET-SECRETS:([A-Za-z0-9+/=]+)', done.stdout):
        values += json.loads(base64.b64decode(encoded))
    if not values and done.returncode != 0:
        return [], (done.stderr or done.stdout).strip()[-500:]
    return values, None


class Scrubber:
    """Masks every known secret value in text and in files."""

    def __init__(self, values):
        forms = set()
        for v in values:
            v = str(v)
            if len(v) < MIN_LEN:
                continue
            forms.update((v, json.dumps(v)[1:-1]))  # as is, and as it appears inside a JSON string
        # Longest first, so a secret that contains another is masked whole.
        self.forms = sorted(forms, key=len, reverse=True)
        self.count = 0

    def text(self, text):
        for form in self.forms:
            if form in text:
                self.count += text.count(form)
                text = text.replace(form, MASK)
        return text

    def tree(self, top):
        """Rewrite every regular file under top with the secrets masked; returns the files changed."""
        changed = []
        forms = [f.encode() for f in self.forms]
        for root, dirs, files in os.walk(top):
            for name in files:
                path = os.path.join(root, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, 'rb') as fh:
                    data = fh.read()
                new = data
                for form in forms:
                    if form in new:
                        self.count += new.count(form)
                        new = new.replace(form, MASK.encode())
                if new != data:
                    with open(path, 'wb') as fh:
                        fh.write(new)
                    changed.append(path)
        return changed
