"""A NATS operator, accounts and users made in the test (decentralised auth, what `nsc` does):
NKeys from the `nkeys` package, JWTs signed by hand (ed25519 over base64url JSON claims), the
server's config in operator mode with a memory resolver, and users' `.creds` files."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import nkeys

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
UNLIMITED = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def new_key(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def public(key: nkeys.KeyPair) -> str:
    return str(key.public_key.decode())


def sign(issuer: nkeys.KeyPair, subject: str, name: str, nats: dict[str, Any], **extra: Any) -> str:
    """A JWT for `subject` issued (and signed) by `issuer`."""
    claims = {
        "jti": _b64(os.urandom(24)),
        "iat": int(time.time()) - 60,
        "iss": public(issuer),
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
        **extra,
    }
    head = _b64(json.dumps(HEADER).encode()) + "." + _b64(json.dumps(claims).encode())
    return head + "." + _b64(issuer.sign(head.encode()))


class Operator:
    """An operator with a system account and one application account `APP` with JetStream."""

    def __init__(self) -> None:
        self.key = new_key(nkeys.PREFIX_BYTE_OPERATOR)
        self.system = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
        self.account = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
        self.jwt = sign(
            self.key,
            public(self.key),
            "test-operator",
            {"type": "operator", "system_account": public(self.system)},
        )
        self.accounts = {
            public(self.system): sign(
                self.key, public(self.system), "SYS", {"type": "account", "limits": UNLIMITED}
            ),
            public(self.account): sign(
                self.key,
                public(self.account),
                "APP",
                {"type": "account", "limits": {**UNLIMITED, **JETSTREAM}},
            ),
        }

    def server_config(self, folder: Path) -> str:
        """nats-server config text for operator mode with these accounts preloaded."""
        (folder / "operator.jwt").write_text(self.jwt)
        preload = "".join(f'  {k}: "{v}"\n' for k, v in self.accounts.items())
        return (
            f'operator: "{folder / "operator.jwt"}"\n'
            f'system_account: "{public(self.system)}"\n'
            "resolver: MEMORY\n"
            f"resolver_preload: {{\n{preload}}}\n"
        )

    def user_creds(
        self, path: Path, name: str = "scheduler", *, expired: bool = False, signer: Any = None
    ) -> Path:
        """A `.creds` file for a new user of APP (signed by `signer`, default the account)."""
        user = new_key(nkeys.PREFIX_BYTE_USER)
        extra = {"exp": int(time.time()) - 30} if expired else {}
        nats = {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}
        issuer = signer or self.account
        nats["issuer_account"] = public(self.account) if signer is not None else None
        if nats["issuer_account"] is None:
            del nats["issuer_account"]
        token = sign(issuer, public(user), name, nats, **extra)
        path.write_text(
            "-----BEGIN NATS USER JWT-----\n"
            f"{token}\n"
            "------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"{user.seed.decode()}\n"
            "------END USER NKEY SEED------\n\n"
            "*************************************************************\n"
        )
        path.chmod(0o600)
        return path
