"""Keys of deployment packages: the server's Ed25519 signing key and each organization's AES-256-GCM key."""
from __future__ import annotations

import base64
import hashlib
import os
import secrets

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import IntegrityError, transaction

from .models import PackageKey

NONCE_BYTES = 12
TAG_BYTES = 16
STREAM_BYTES = 1024 * 1024


def signing_key() -> Ed25519PrivateKey:
    """The server's package signing key; made once (mode 0600) when the file does not exist."""
    path = settings.PACKAGE_SIGNING_KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            pass
        else:
            with os.fdopen(fd, "wb") as handle:
                handle.write(pem)
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key (KILN_PACKAGE_SIGNING_KEY).")
    return key


def public_key_pem() -> str:
    return signing_key().public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def public_key_fingerprint() -> str:
    raw = signing_key().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(data: bytes) -> bytes:
    return signing_key().sign(data)


def _wrapping_key() -> AESGCM:
    # Derived from the token key, which (unlike SECRET_KEY) is meant to stay fixed for the life of an install.
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"kiln package keys").derive(settings.TOKEN_HMAC_KEY.encode())
    return AESGCM(derived)


def key_id_of(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


def organization_package_key(*, organization) -> tuple[bytes, str]:
    """The organization's package key and its id, made on first use."""
    row = PackageKey.objects.filter(organization=organization).first()
    if row is None:
        key = AESGCM.generate_key(bit_length=256)
        nonce = secrets.token_bytes(NONCE_BYTES)
        wrapped = base64.b64encode(nonce + _wrapping_key().encrypt(nonce, key, str(organization.id).encode())).decode()
        try:
            with transaction.atomic():
                row = PackageKey.objects.create(organization=organization, key_id=key_id_of(key), wrapped_key=wrapped)
        except IntegrityError:
            row = PackageKey.objects.get(organization=organization)
    raw = base64.b64decode(row.wrapped_key)
    key = _wrapping_key().decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], str(organization.id).encode())
    return key, row.key_id


def encrypt_stream(*, key: bytes, source, target, associated_data: bytes) -> None:
    """AES-256-GCM from one file object to another, a megabyte at a time: nonce, ciphertext, tag.

    The output is what `AESGCM(key).decrypt(nonce, ciphertext + tag, associated_data)` opens, so the
    package's loader needs no streaming, and a model of gigabytes never sits in the server's memory.
    """
    nonce = secrets.token_bytes(NONCE_BYTES)
    encryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    encryptor.authenticate_additional_data(associated_data)
    target.write(nonce)
    while block := source.read(STREAM_BYTES):
        target.write(encryptor.update(block))
    target.write(encryptor.finalize())
    target.write(encryptor.tag)
