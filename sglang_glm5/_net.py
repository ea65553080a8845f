"""What a server the package starts (SGLang, the router) will bind: checked before anything starts."""

from __future__ import annotations

import errno
import socket


def check_bind(host: str, port: int, option: str = "--port") -> None:
    """ValueError unless ``port`` can be bound on ``host`` (on any of the addresses its name resolves to, as a
    server's own bind would try), told apart: a name that does not resolve, no address of this machine, a port in
    use (``option`` names the port's flag)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: not an address or a name this machine can resolve ({e.strerror})") from None
    busy = None
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server's bind: TIME_WAIT is no conflict
                s.bind(address)
            return
        except OSError as e:
            if e.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                busy = busy or e
            last = e
    if busy is not None:
        raise ValueError(f"{option} {port} on {host} is not free ({busy.strerror}); choose another {option}")
    raise ValueError(
        f"--host {host}: not an address of this machine ({last.strerror}); use one of its own addresses, "
        "127.0.0.1 or 0.0.0.0"
    )
