"""The lab's API certificate and the credentials the collection logs in with."""

import datetime
import ipaddress
import os
import secrets
import uuid
from ..layout import GATEWAY, SUBNET_PREFIX, write_json

from ._util import _write


# -- TLS and credentials ------------------------------------------------------------------
def ensure_tls(lab):
    """A lab CA and a server certificate it signs, for the API address: clients verify it with ca_path."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    server = os.path.join(lab.tls_dir, 'server.pem')
    now = datetime.datetime.now(datetime.timezone.utc)
    if os.path.exists(server) and os.path.exists(lab.ca_file):
        with open(server, 'rb') as fh:
            cert = x509.load_pem_x509_certificate(fh.read())
        try:  # one made before the lab gave its certificates their key identifiers is made again
            cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
            current = True
        except x509.ExtensionNotFound:
            current = False
        if current and cert.not_valid_after_utc > now + datetime.timedelta(days=7):
            return
    os.makedirs(lab.tls_dir, mode=0o700, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'gpufleet lab CA')])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName('localhost'), x509.DNSName(lab.node),
             x509.IPAddress(ipaddress.ip_address(lab.api_host))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, lab.node)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            # the key identifiers a CA's tools write (openssl's default v3 extensions): Python 3.13 and later verify
            # strictly (ssl.VERIFY_X509_STRICT) and refuse a certificate that lacks its Authority Key Identifier
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    _write(lab.ca_file, ca.public_bytes(pem), 0o644)
    _write(server, cert.public_bytes(pem), 0o644)
    _write(os.path.join(lab.tls_dir, 'server.key'),
           key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()),
           0o600)


def ensure_credentials(lab):
    """The lab's logins (kept across `up`s): root@pam's password, an API token, and how to reach the node."""
    if os.path.exists(lab.credentials_file):
        return lab.credentials()
    creds = {
        'api_host': lab.api_host, 'api_port': lab.api_port, 'api_user': 'root@pam',
        'api_password': secrets.token_urlsafe(18), 'api_token_id': 'gpufleet',
        'api_token_secret': str(uuid.uuid4()), 'ca_path': lab.ca_file, 'node': lab.node,
        'ssh_host': '127.0.0.1', 'ssh_port': lab.ssh_port, 'ssh_user': 'root',
        'ssh_private_key_file': os.path.join(lab.ssh_dir, 'id_ed25519'),
        'ssh_known_hosts_file': os.path.join(lab.ssh_dir, 'known_hosts'),
        'wheelhouse': lab.wheelhouse, 'bridge': lab.bridge, 'gateway': GATEWAY,
        'subnet': SUBNET_PREFIX + '.0/24', 'proc_root': lab.proc_dir,
    }
    write_json(lab.credentials_file, creds, mode=0o600)
    return creds
