"""HMAC-SHA256 signatures of files, with a per-user key kept outside every run directory.

Ray Tune unpickles parts of a run directory when it resumes one (``tuner.pkl``, its experiment snapshots),
and unpickling runs code. ablate therefore signs every such file when its own process writes it, and checks
the signature before letting Ray read the file again: only what ablate wrote is ever unpickled. The
run-directory policy (which files, when) lives in :mod:`ablate.service.trust`; this module only knows keys,
digests and the signature file. It imports nothing from Ray or the rest of ablate.

- The key: 32 random bytes, hex-encoded, in ``~/.config/ablate/signing.key`` (``$XDG_CONFIG_HOME`` is
  honoured; the environment variable :data:`KEY_ENV` names another file). It is created on first use with
  mode 0600 in a 0700 folder, and refused when others may read it.
- A digest is ``HMAC-SHA256(key, "ablate-signature-v1" NUL name NUL content)``: it binds the file's base name
  as well as its bytes, but not the folder, so a run directory that is moved or copied by its owner stays
  resumable.
- A signature file is JSON, ``{"version": 1, "algorithm": "HMAC-SHA256", "files": {name: [digest, ...]}}``,
  with the last :data:`HISTORY` digests of each name, newest last: Ray rewrites the same file many times
  and copies it into place in the background, so the copy on disk may be a few versions behind the newest.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "HISTORY",
    "KEY_ENV",
    "SigningError",
    "digest",
    "file_digest",
    "key_file",
    "load_key",
    "problem",
    "read_signatures",
    "record",
    "sign",
]

#: Environment variable naming the key file (tests and shared machines use it).
KEY_ENV = "ABLATE_KEY_FILE"
#: How many digests of one file name a signature file keeps.
HISTORY = 16
_KEY_BYTES = 32
_DOMAIN = b"ablate-signature-v1"
_FORMAT = {"version": 1, "algorithm": "HMAC-SHA256"}


class SigningError(RuntimeError):
    """The signing key cannot be created or read; the message names the file and what to do."""


def key_file() -> Path:
    """Where the signing key lives: ``$ABLATE_KEY_FILE``, else ``$XDG_CONFIG_HOME/ablate/signing.key``
    (``~/.config/ablate/signing.key``)."""
    explicit = os.environ.get(KEY_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(config).expanduser() / "ablate" / "signing.key"


def load_key(path: str | os.PathLike | None = None) -> bytes:
    """The signing key in ``path`` (default :func:`key_file`), created (mode 0600) when it does not exist.

    Two processes creating it at once agree on one key: each writes a private temporary file and links it
    into place, and the loser reads the winner's key.
    """
    path = Path(path) if path is not None else key_file()
    if not path.exists():
        _create_key(path)
    return _read_key(path)  # read each time (a few bytes): a key whose mode was loosened is refused at once


def _create_key(path: Path) -> None:
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
        os.chmod(path.parent, 0o700)  # mkdir's mode passes through the umask
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(_KEY_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made the key first: use that one
    except OSError as exc:
        raise SigningError(
            f"signing key {path}: cannot be created ({exc.strerror}); set {KEY_ENV} to a writable file"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def _read_key(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise SigningError(f"signing key {path}: cannot be read ({exc.strerror})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SigningError(
            f"signing key {path}: mode {stat.S_IMODE(mode):04o} lets other users read or change it; "
            f"run `chmod 600 {path}` (or delete it: a new key is made, and runs signed with the old one need "
            "--trust-run-dir once)"
        )
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < _KEY_BYTES:
        raise SigningError(f"signing key {path}: not a key ablate wrote (expected {2 * _KEY_BYTES} hex digits)")
    return key


def digest(key: bytes, name: str, data: bytes) -> str:
    """The hex HMAC-SHA256 of a file named ``name`` (its base name) holding ``data``."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    mac.update(_DOMAIN + b"\0" + name.encode() + b"\0")
    mac.update(data)
    return mac.hexdigest()


def file_digest(key: bytes, path: str | os.PathLike) -> str:
    """:func:`digest` of the file at ``path`` under its base name."""
    path = Path(path)
    return digest(key, path.name, path.read_bytes())


def read_signatures(signature_file: str | os.PathLike) -> dict[str, list[str]]:
    """name → digests from a signature file; empty when it is missing or not one ablate wrote."""
    try:
        data = json.loads(Path(signature_file).read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        return {}
    return {k: [d for d in v if isinstance(d, str)] for k, v in files.items() if isinstance(v, list)}


def record(signature_file: str | os.PathLike, digests: dict[str, str], keep: int = HISTORY) -> None:
    """Add name → digest entries to a signature file (atomically), keeping the newest ``keep`` per name."""
    signature_file = Path(signature_file)
    files = read_signatures(signature_file)
    changed = False
    for name, value in digests.items():
        known = files.setdefault(name, [])
        if known and known[-1] == value:
            continue
        if value in known:
            known.remove(value)
        known.append(value)
        del known[:-keep]
        changed = True
    if not changed and signature_file.exists():
        return
    text = json.dumps({**_FORMAT, "files": files}, indent=1, sort_keys=True)
    tmp = signature_file.with_name(f".{signature_file.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, signature_file)


def sign(signature_file: str | os.PathLike, paths: Iterable[str | os.PathLike], key: bytes) -> None:
    """Record the digest of each file in ``paths`` (under its base name) in ``signature_file``."""
    record(signature_file, {Path(p).name: file_digest(key, p) for p in paths})


def problem(signatures: dict[str, list[str]], path: str | os.PathLike, key: bytes) -> str | None:
    """Why the file at ``path`` is not one of the signed versions in ``signatures`` (from
    :func:`read_signatures`), or None when it is."""
    path = Path(path)
    known = signatures.get(path.name)
    if not known:
        return "unsigned"
    try:
        value = file_digest(key, path)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not any(hmac.compare_digest(value, d) for d in known):
        return "altered: its signature does not match"
    return None
