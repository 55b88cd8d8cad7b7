#!/usr/bin/env python3
"""Create a private certificate authority and the TLS certificates of a gtopk-lab cluster.

Dask's TLS is mutual: the scheduler, every worker and every client present a certificate
signed by the cluster's CA and check the peer's certificate against that CA (Dask does not
check host names: the CA *is* the trust boundary). This script writes, into one folder::

    ca.pem                         the CA certificate (give it to every role)
    ca-key.pem                     the CA private key (keep it OFF the cluster; needed only
                                   to sign more certificates later)
    scheduler.pem  scheduler-key.pem
    worker.pem     worker-key.pem
    client.pem     client-key.pem

Algorithm: one ECDSA P-256 (default) or RSA-3072 key per role, a self-signed CA certificate
(``basicConstraints CA:TRUE``, ``keyCertSign``) and one leaf certificate per role signed by it
(``CA:FALSE``, ``digitalSignature``, extended key usage serverAuth + clientAuth, because every
Dask role both listens and connects). Subject alternative names list the host names and IP
addresses given with ``--san`` (``localhost`` and ``127.0.0.1`` are always included), which
helps generic TLS tools (``openssl s_client -verify_hostname``) even though Dask ignores them.
Cost: a handful of key generations; well under a second for ECDSA, about a second per
RSA-3072 key.

Private keys are written with mode 0600, certificates with 0644. Re-running refuses to
overwrite an existing CA unless ``--force`` is given, so that already deployed certificates
are not silently invalidated.

Example::

    python cluster/make_certs.py --out cluster/certs --san scheduler --san 10.0.0.5
    openssl verify -CAfile cluster/certs/ca.pem cluster/certs/worker.pem

Requires the ``cryptography`` package (a dev extra of gtopk-lab, installed in the images).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import sys
from collections.abc import Sequence
from pathlib import Path

#: The roles of a Dask cluster that need a certificate of their own.
ROLES: tuple[str, ...] = ("scheduler", "worker", "client")
KEY_TYPES: tuple[str, ...] = ("ecdsa", "rsa")
#: Names that every certificate lists, so that single-host tests and tools work out of the box.
DEFAULT_SANS: tuple[str, ...] = ("localhost", "127.0.0.1")


def _new_key(key_type: str):  # -> PrivateKeyTypes; kept untyped so that the import stays lazy
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if key_type == "ecdsa":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=3072)
    raise ValueError(f"key_type={key_type!r} is invalid: expected one of {', '.join(KEY_TYPES)}")


def _general_names(sans: Sequence[str]) -> list:
    from cryptography import x509

    names: list = []
    seen: set[str] = set()
    for san in (*DEFAULT_SANS, *sans):
        if not isinstance(san, str) or not san.strip():
            raise ValueError(f"san={san!r} is invalid: expected a host name or an IP address")
        san = san.strip()
        if san in seen:
            continue
        seen.add(san)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            names.append(x509.DNSName(san))
    return names


def _write(path: Path, data: bytes, mode: int) -> None:
    # Create with the final mode so that a private key is never readable by others,
    # not even for the moment between write and chmod.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, mode)


def make_certificates(
    out_dir: str | os.PathLike[str],
    *,
    sans: Sequence[str] = (),
    valid_days: int = 365,
    key_type: str = "ecdsa",
    cluster_name: str = "gtopk-lab",
    force: bool = False,
) -> dict[str, Path]:
    """Write a CA and scheduler/worker/client certificates into ``out_dir``.

    Returns a mapping ``{"ca": ca.pem, "ca_key": ..., "scheduler": scheduler.pem,
    "scheduler_key": scheduler-key.pem, ...}``. Raises ``ValueError`` for a bad argument
    and ``FileExistsError`` when ``out_dir/ca.pem`` exists and ``force`` is false.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if isinstance(valid_days, bool) or not isinstance(valid_days, int):
        raise TypeError(f"valid_days={valid_days!r} has type {type(valid_days).__name__}: expected int")
    if not 1 <= valid_days <= 3650:
        raise ValueError(f"valid_days={valid_days!r} is invalid: expected an integer in [1, 3650]")
    if key_type not in KEY_TYPES:
        raise ValueError(f"key_type={key_type!r} is invalid: expected one of {', '.join(KEY_TYPES)}")
    if not isinstance(cluster_name, str) or not cluster_name.strip():
        raise ValueError(f"cluster_name={cluster_name!r} is invalid: expected a non-empty string")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "ca.pem").exists() and not force:
        raise FileExistsError(
            f"{out / 'ca.pem'} exists: pass --force to replace the CA (every deployed "
            "certificate signed by the old CA then stops working)"
        )
    san_ext = x509.SubjectAlternativeName(_general_names(sans))

    now = dt.datetime.now(dt.timezone.utc)
    # Back-date a little so that machines with slightly skewed clocks accept the certificates.
    not_before = now - dt.timedelta(minutes=5)
    not_after = now + dt.timedelta(days=valid_days)

    ca_key = _new_key(key_type)
    ca_name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, cluster_name),
        x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster_name} cluster CA"),
    ])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True,
                          crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def key_pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    paths: dict[str, Path] = {"ca": out / "ca.pem", "ca_key": out / "ca-key.pem"}
    _write(paths["ca_key"], key_pem(ca_key), 0o600)
    _write(paths["ca"], ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)

    for role in ROLES:
        key = _new_key(key_type)
        name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, cluster_name),
            x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster_name} {role}"),
        ])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, content_commitment=False,
                              key_encipherment=key_type == "rsa", data_encipherment=False,
                              key_agreement=False, key_cert_sign=False, crl_sign=False,
                              encipher_only=False, decipher_only=False),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(san_ext, critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        paths[role] = out / f"{role}.pem"
        paths[f"{role}_key"] = out / f"{role}-key.pem"
        _write(paths[f"{role}_key"], key_pem(key), 0o600)
        _write(paths[role], cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="cluster/certs", help="output folder (default: cluster/certs)")
    parser.add_argument("--san", action="append", default=[], metavar="NAME_OR_IP",
                        help="extra subject alternative name (repeatable), e.g. the scheduler's host")
    parser.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    parser.add_argument("--key-type", choices=KEY_TYPES, default="ecdsa")
    parser.add_argument("--name", default="gtopk-lab", help="organisation name in the certificates")
    parser.add_argument("--force", action="store_true", help="replace an existing CA")
    args = parser.parse_args(argv)
    try:
        paths = make_certificates(args.out, sans=args.san, valid_days=args.days,
                                  key_type=args.key_type, cluster_name=args.name, force=args.force)
    except (ValueError, TypeError, FileExistsError) as exc:
        print(f"make_certs: error: {exc}", file=sys.stderr)
        return 2
    for label, path in paths.items():
        print(f"{label:14s} {path}")
    print("Keep ca-key.pem off the cluster machines; distribute ca.pem plus one role's pair.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
