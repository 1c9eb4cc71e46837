"""Fetch an image by its http(s) URL, safely: the host is resolved and every address it
has must be public (not loopback, private, link-local, shared, multicast or reserved)
unless the server allows private image URLs; the connection goes to the address that was
checked (a second DNS answer cannot point it elsewhere); redirects are checked the same way;
the body is cut at the size cap and the whole fetch at the time cap, each named with its
value in the error.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from app import __version__
from app.images.decode import too_large
from app.images.errors import IMAGE_FETCH_FAILED, IMAGE_URL_REFUSED, ImageError

#: Redirects followed, each checked as the first URL was.
MAX_REDIRECTS = 5
CHUNK = 64 * 1024
REDIRECTS = (301, 302, 303, 307, 308)
#: The threads that resolve image hosts (made on first use).
_dns: ThreadPoolExecutor | None = None
_dns_lock = threading.Lock()


@dataclass(frozen=True)
class FetchRules:
    """How image URLs are fetched (from the settings)."""

    max_bytes: int
    timeout: float  # seconds for the whole fetch: resolving, connecting, every redirect, the body
    allow_private: bool = False


def fetch_image(url: str, rules: FetchRules) -> bytes:
    """The body at `url`; ImageError (`image_url_refused`, `image_fetch_failed`,
    `image_too_large`) says why there is none."""
    deadline = time.monotonic() + rules.timeout
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        try:
            status, location, body = _get(current, rules, deadline)
        except TimeoutError:
            raise ImageError(
                f"Fetching the image at {_shown(url)} took longer than the {rules.timeout:g} s "
                f"limit (--image-fetch-timeout {rules.timeout:g}).",
                code=IMAGE_FETCH_FAILED,
            ) from None
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            raise ImageError(
                f"The image at {_shown(url)} could not be fetched: {exc or type(exc).__name__}.",
                code=IMAGE_FETCH_FAILED,
            ) from None
        if status in REDIRECTS:
            if not location:
                raise ImageError(
                    f"The image at {_shown(url)} redirected ({status}) without a Location.",
                    code=IMAGE_FETCH_FAILED,
                )
            current = urljoin(current, location)
            continue
        if not 200 <= status < 300:
            raise ImageError(
                f"The image at {_shown(url)} could not be fetched: the server answered "
                f"HTTP {status}.",
                code=IMAGE_FETCH_FAILED,
            )
        return body
    raise ImageError(
        f"The image at {_shown(url)} redirected more than {MAX_REDIRECTS} times.",
        code=IMAGE_FETCH_FAILED,
    )


def _resolve(host: str, port: int, timeout: float | None) -> list[Any]:
    """getaddrinfo within `timeout` seconds (it has no timeout of its own: it runs in a
    thread of its own and is left to finish there when it takes longer)."""
    global _dns
    if timeout is None:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    with _dns_lock:
        if _dns is None:
            _dns = ThreadPoolExecutor(4, thread_name_prefix="image-dns")
        pool = _dns
    lookup = pool.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        return lookup.result(timeout=timeout)
    except FutureTimeout:
        raise TimeoutError from None


def checked_address(
    url: str, allow_private: bool, timeout: float | None = None
) -> tuple[str, str, int, list[str]]:
    """(scheme, host, port, the addresses to connect to) of an http(s) URL whose host may be
    fetched; ImageError (`image_url_refused`) otherwise. Every address the name resolves to
    is checked, so a name with one public and one private address is refused too."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ImageError(
            f"The image URL {_shown(url)} is not http(s) or data:; batchyard fetches only "
            "those (or give a file_id).",
            code=IMAGE_URL_REFUSED,
        )
    host = parts.hostname
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        host = None
    if not host:
        raise ImageError(f"The image URL {_shown(url)} has no host.", code=IMAGE_URL_REFUSED)
    try:
        infos = _resolve(host, port, timeout)
    except (socket.gaierror, UnicodeError) as exc:
        raise ImageError(
            f"The image URL's host {host!r} could not be resolved: {exc}.",
            code=IMAGE_FETCH_FAILED,
        ) from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not allow_private:
        for address in addresses:
            why = refused_address(address)
            if why:
                raise ImageError(
                    f"The image URL {_shown(url)} points to {address}, {why}; batchyard "
                    "fetches images only from public addresses unless it is started with "
                    "--allow-private-image-urls.",
                    code=IMAGE_URL_REFUSED,
                )
    return scheme, host, port, addresses


def refused_address(address: str) -> str | None:
    """Why an address is not fetched by default ("a loopback address", ...), or None for a
    public one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for test, what in (
        (ip.is_loopback, "a loopback address"),
        (ip.is_unspecified, "the unspecified address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_private, "a private address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "not a public address"),
    ):
        if test:
            return what
    return None


def _connect(addresses: list[str], port: int, timeout: float | None) -> socket.socket:
    """A connection to the first of the checked addresses that answers (a host's IPv6
    address may be unreachable from here while its IPv4 one is not)."""
    failure: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout)
        except TimeoutError:
            raise
        except OSError as exc:
            failure = exc
    assert failure is not None
    raise failure


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to an address that was checked, whatever the name resolves to
    now; the Host header still names the host."""

    def __init__(self, host: str, port: int, addresses: list[str], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses

    def connect(self) -> None:
        self.sock = _connect(self._addresses, self.port, self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a checked address; the certificate is checked against the host's name."""

    def __init__(self, host: str, port: int, addresses: list[str], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._addresses = addresses

    def connect(self) -> None:
        sock = _connect(self._addresses, self.port, self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _get(url: str, rules: FetchRules, deadline: float) -> tuple[int, str | None, bytes]:
    """One GET: (status, Location, body); the body only for a 2xx answer."""
    scheme, host, port, addresses = checked_address(url, rules.allow_private, _left(deadline))
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kind = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    conn = kind(host, port, addresses, _left(deadline))
    try:
        conn.request(
            "GET",
            path,
            headers={"User-Agent": f"batchyard/{__version__}", "Accept": "image/*"},
        )
        response = conn.getresponse()
        if not 200 <= response.status < 300:
            return response.status, response.getheader("Location"), b""
        length = response.getheader("Content-Length")
        if length and length.isdigit() and int(length) > rules.max_bytes:
            raise too_large(f"The image at {_shown(url)} ({length} bytes)", rules.max_bytes)
        chunks: list[bytes] = []
        size = 0
        while True:
            if conn.sock is not None:
                conn.sock.settimeout(_left(deadline))
            chunk = response.read1(CHUNK) if hasattr(response, "read1") else response.read(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > rules.max_bytes:
                raise too_large(f"The image at {_shown(url)}", rules.max_bytes)
            chunks.append(chunk)
            _left(deadline)
        return response.status, None, b"".join(chunks)
    finally:
        conn.close()


def _shown(url: str) -> str:
    """A URL as an error shows it: whole unless very long."""
    return url if len(url) <= 200 else url[:197] + "..."
