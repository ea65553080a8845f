"""What a server the package starts (SGLang, the router) will bind: checked before anything starts."""

from __future__ import annotations

import errno
import socket


def check_bind(host: str, port: int, option: str = "--port") -> None:
    """ValueError unless ``host`` resolves to an address of this machine and ``port`` is free on it, told apart:
    a name that does not resolve, an address of another machine, a port in use (``option`` names the port's flag)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: not an address or a name this machine can resolve ({e.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's own bind: TIME_WAIT is no conflict
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise ValueError(
                    f"--host {host}: not an address of this machine ({e.strerror}); use one of its own addresses, "
                    "127.0.0.1 or 0.0.0.0"
                ) from None
            raise ValueError(f"{option} {port} on {host} is not free ({e.strerror}); choose another {option}") from None
