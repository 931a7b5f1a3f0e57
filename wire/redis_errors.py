"""Say why Redis refused a connection, so a bad password or certificate reads as one.

redis-py reports a wrong password, an untrusted certificate and a missing ACL
permission as it received them; :func:`explain` puts the cause people look for first
("authentication failed", "TLS certificate verify failed", "the server refused this
client's TLS certificate") and :func:`is_misconfiguration` tells the failures that
retrying cannot cure from an outage that it can.

A server that requires a client certificate (``tls-auth-clients yes``) and gets none,
or one it does not trust, says so with a TLS alert after the handshake. Under TLS 1.3
the client may see either that alert or, when its first write meets the closed
connection before it reads the alert, only "EOF occurred in violation of protocol":
both are the server refusing this client, and both are classed as such. The alert may
sit in the exception's chain rather than in its message, so the whole chain is read.
An asyncio client can see neither, only "Connection reset by peer": the server's reset
of a connection that still held the client's first command discards the alert.
:func:`tls_refusal` then asks the server once more, without sending anything, and reads
its alert.
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import parse_qs, unquote, urlsplit

import redis

__all__ = ["explain", "is_misconfiguration", "tls_refusal"]

_CERTIFICATE = ("certificate verify failed", "certificate_verify_failed")
#: The server refused this client at the TLS layer: its alerts about our certificate,
#: and the EOF a first write meets when the server has already closed.
_CLIENT_REFUSED = (
    "alert certificate required",
    "alert unknown ca",
    "alert bad certificate",
    "alert certificate unknown",
    "alert certificate expired",
    "alert certificate revoked",
    "alert unsupported certificate",
    "alert access denied",
    "eof occurred in violation of protocol",
)
#: TLS spoken to a server that speaks plain text.
_NOT_TLS = ("wrong version number", "record layer failure", "packet length too long")
_HANDSHAKE = ("ssl", "tls")


def _chain_text(exc: BaseException) -> str:
    """The messages of ``exc`` and of the exceptions it was raised from, lowercased."""
    texts = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        texts.append(str(current))
        current = current.__cause__ or current.__context__
    return " | ".join(texts).lower()


def _kind(exc: BaseException) -> str:
    text = str(exc).lower()
    if isinstance(exc, redis.AuthenticationError) or text.startswith(("wrongpass", "noauth")):
        return "auth"
    if isinstance(exc, redis.exceptions.NoPermissionError) or text.startswith("noperm"):
        return "acl"
    chain = _chain_text(exc)
    if any(marker in chain for marker in _CERTIFICATE):
        return "certificate"
    if not isinstance(exc, redis.ConnectionError | OSError):
        return ""
    if any(marker in chain for marker in _CLIENT_REFUSED):
        return "client-certificate"
    if any(marker in chain for marker in _NOT_TLS):
        return "not-tls"
    if any(marker in chain for marker in _HANDSHAKE):
        return "handshake"
    return ""


def _alert(exc: BaseException) -> str:
    """The TLS alert about this client's certificate in ``exc``'s chain, or ``""``."""
    chain = _chain_text(exc)
    return next(
        (marker.removeprefix("alert ") for marker in _CLIENT_REFUSED[:-1] if marker in chain), ""
    )


def explain(exc: BaseException) -> str:
    """``exc``'s message, led by its cause when it is authentication, ACL or TLS."""
    text = str(exc) or type(exc).__name__
    kind = _kind(exc)
    if kind == "auth":
        return f"authentication failed: check the user name and password in the URL ({text})"
    if kind == "acl":
        return (
            "the Redis user is not allowed this command or key (see docs/security.md for the ACL): "
            f"{text}"
        )
    if kind == "certificate":
        return (
            "TLS certificate verify failed: the server's certificate is not signed by a CA this "
            f"process trusts (set ssl_ca_certs in the URL) ({text})"
        )
    if kind == "client-certificate":
        alert = _alert(exc)
        found = (
            f"the server refused this client's TLS certificate (its alert: {alert})"
            if alert
            else (
                "the server closed the TLS connection as it opened, as Redis does when it requires "
                "a client certificate and gets none, or one it does not trust"
            )
        )
        return (
            f"{found}: set ssl_certfile and ssl_keyfile in the URL to a client certificate signed "
            f"by a CA the server trusts, and its key ({text})"
        )
    if kind == "not-tls":
        return (
            "TLS handshake failed: the server does not speak TLS on this port (use redis://, not "
            f"rediss://) ({text})"
        )
    if kind == "handshake":
        return (
            "TLS handshake failed: check that the URL's scheme (rediss:// for TLS) matches the "
            f"server, and that it has a client certificate if the server requires one ({text})"
        )
    return text


def is_misconfiguration(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal that retrying cannot cure: credentials, ACL or certificates."""
    return _kind(exc) in ("auth", "acl", "certificate", "client-certificate", "not-tls")


#: Failures after which a ``rediss://`` server may have refused the client's certificate.
_DROPPED = ("reset by peer", "eof occurred", "closed by server", "connection closed", "broken pipe")


def tls_refusal(url: str, failure: str, *, timeout: float = 1.0) -> str | None:
    """Whether a TLS server refuses this client's certificate; what :func:`explain` says if so.

    Only a ``rediss://`` URL whose connection was dropped (``failure``, the error's text,
    says reset, EOF or closed) is probed: one TLS connection with the URL's certificate
    settings that sends nothing and reads the server's first word. A server that refuses
    the client's certificate sends its alert at once; one that accepts it says nothing,
    and the probe gives up after ``timeout`` seconds.

    Returns:
        The explanation of the refusal, or None: the server accepted the certificate, is
        not reachable, or the failure was of another kind.
    """
    parts = urlsplit(url)
    if parts.scheme != "rediss" or not any(marker in failure.lower() for marker in _DROPPED):
        return None
    query = {name: unquote(values[-1]) for name, values in parse_qs(parts.query).items()}
    try:
        context = ssl.create_default_context(cafile=query.get("ssl_ca_certs"))
        context.check_hostname = False  # the server's own certificate is not what is asked here
        if query.get("ssl_cert_reqs", "required").lower() in ("none", "cert_none"):
            context.verify_mode = ssl.CERT_NONE
        if query.get("ssl_certfile"):
            context.load_cert_chain(query["ssl_certfile"], query.get("ssl_keyfile"))
        address = (parts.hostname or "localhost", parts.port or 6379)
        with (
            socket.create_connection(address, timeout=timeout) as raw,
            context.wrap_socket(raw) as tls,
        ):
            tls.recv(1)
    except ssl.SSLError as exc:
        refused = redis.ConnectionError(str(exc))
        return explain(refused) if _kind(refused) == "client-certificate" else None
    except OSError:  # unreachable, or the timeout: the server took the certificate
        return None
    return None
