"""Fetching an image URL safely, against a real HTTP server on 127.0.0.1: loopback (and any
other address that is not public) refused by default and fetched when allowed; the size cap
and the time cap, each named with its value; redirects checked again."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.images import FetchRules, ImageError, fetch_image, refused_address
from tests.images import ImageServer, image_bytes

ALLOWED = FetchRules(max_bytes=1 << 20, timeout=5.0, allow_private=True)
DEFAULT = FetchRules(max_bytes=1 << 20, timeout=5.0)


@pytest.fixture
def server() -> Iterator[ImageServer]:
    s = ImageServer(files={"a.png": image_bytes("PNG")})
    yield s
    s.close()


def refused(url: str, rules: FetchRules) -> ImageError:
    with pytest.raises(ImageError) as caught:
        fetch_image(url, rules)
    return caught.value


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd00::1", "a private address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("0.0.0.0", "the unspecified address"),
        ("100.64.0.1", "not a public address"),
        ("224.0.0.1", "a multicast address"),
        ("240.0.0.1", "a private address"),
    ],
)
def test_addresses_that_are_not_public_are_refused(address: str, why: str) -> None:
    assert refused_address(address) == why


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111"])
def test_public_addresses_are_fetched(address: str) -> None:
    assert refused_address(address) is None


def test_loopback_is_refused_by_default_naming_the_address_and_the_flag(
    server: ImageServer,
) -> None:
    err = refused(server.url("a.png"), DEFAULT)
    assert (err.code, err.status_code) == ("image_url_refused", 400)
    assert "127.0.0.1, a loopback address" in err.message
    assert "--allow-private-image-urls" in err.message
    assert server.asked["/a.png"] == 0  # nothing was sent


def test_a_name_that_resolves_to_loopback_is_refused_too(server: ImageServer) -> None:
    err = refused(f"http://localhost:{server.port}/a.png", DEFAULT)
    assert err.code == "image_url_refused" and "loopback" in err.message


def test_loopback_is_fetched_when_allowed(server: ImageServer) -> None:
    assert fetch_image(server.url("a.png"), ALLOWED) == image_bytes("PNG")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a.png", "gopher://x/"])
def test_schemes_other_than_http_are_refused(url: str) -> None:
    err = refused(url, ALLOWED)
    assert err.code == "image_url_refused" and "http(s)" in err.message


def test_a_redirect_is_followed_and_checked_again(server: ImageServer) -> None:
    assert fetch_image(server.url(f"redirect?to={server.url('a.png')}"), ALLOWED) == image_bytes(
        "PNG"
    )
    err = refused(server.url("redirect?to=file:///etc/passwd"), ALLOWED)
    assert err.code == "image_url_refused"


def test_a_missing_image_is_a_failed_fetch_with_the_status(server: ImageServer) -> None:
    err = refused(server.url("nothing.png"), ALLOWED)
    assert err.code == "image_fetch_failed" and "HTTP 404" in err.message


def test_a_body_over_the_size_cap_is_refused_by_its_length(server: ImageServer) -> None:
    server.big = 3 << 20
    err = refused(server.url("big"), ALLOWED)
    assert err.code == "image_too_large"
    assert "1 MB limit" in err.message and "--max-image-bytes 1048576" in err.message


def test_a_body_over_the_size_cap_without_a_length_is_cut_as_it_comes(server: ImageServer) -> None:
    server.big = 3 << 20
    err = refused(server.url("big?chunked"), ALLOWED)
    assert err.code == "image_too_large" and "--max-image-bytes 1048576" in err.message


def test_a_fetch_over_the_time_cap_fails_naming_the_cap(server: ImageServer) -> None:
    server.slow = 5.0
    err = refused(
        server.url("slow"), FetchRules(max_bytes=1 << 20, timeout=0.5, allow_private=True)
    )
    assert err.code == "image_fetch_failed"
    assert "0.5 s limit" in err.message and "--image-fetch-timeout 0.5" in err.message


def test_a_host_that_does_not_resolve_fails_the_fetch() -> None:
    err = refused("http://no-such-host.invalid/a.png", DEFAULT)
    assert err.code == "image_fetch_failed" and "could not be resolved" in err.message


def test_a_name_that_resolves_slowly_counts_against_the_time_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """getaddrinfo has no timeout of its own: a resolver that hangs must not hold the line
    past the cap (the system's resolver is made slow here: there is no slow DNS server)."""
    import socket
    import time

    real = socket.getaddrinfo

    def slow(*args: object, **kwargs: object) -> object:
        time.sleep(2.0)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    err = refused("http://images.example/a.png", FetchRules(max_bytes=100, timeout=0.3))
    assert err.code == "image_fetch_failed" and "0.3 s limit" in err.message


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[str, str]:
    """A self-signed certificate for `localhost`, made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


def test_https_checks_the_certificate_against_the_host_name(
    tls_files: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection goes to the checked address, and TLS still names the host: a
    certificate nobody trusts is refused; once trusted, the image comes back by its host
    name, and not by an address the certificate does not name."""
    server = ImageServer(files={"a.png": image_bytes("PNG")}, tls=tls_files)
    try:
        err = refused(server.url("a.png", host="localhost"), ALLOWED)
        assert err.code == "image_fetch_failed" and "certificate" in err.message
        monkeypatch.setenv("SSL_CERT_FILE", tls_files[0])
        assert fetch_image(server.url("a.png", host="localhost"), ALLOWED) == image_bytes("PNG")
        err = refused(server.url("a.png", host="127.0.0.1"), ALLOWED)
        assert err.code == "image_fetch_failed" and "certificate" in err.message
    finally:
        server.close()
