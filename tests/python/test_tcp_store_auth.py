"""Optional shared-secret authentication of TCPStore connections."""

from datetime import timedelta

import pytest

import c10d


def _server(secret):
    return c10d.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=10),
        secret=secret,
    )


def test_client_with_secret_is_served():
    server = _server("s3cret")
    client = c10d.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5), secret="s3cret")
    client.set("k", "v")
    assert server.get("k") == b"v"
    assert client.clone().get("k") == b"v"  # clones authenticate too


@pytest.mark.parametrize("secret", [None, "wrong", ""])
def test_client_without_the_secret_is_refused_clearly(secret, monkeypatch):
    monkeypatch.delenv("C10D_STORE_SECRET", raising=False)
    server = _server("s3cret")
    with pytest.raises(c10d.DistNetworkError, match="shared secret"):
        c10d.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5), secret=secret)
    # The server keeps serving authenticated clients.
    ok = c10d.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5), secret="s3cret")
    ok.set("still", "here")


def test_secret_from_environment(monkeypatch):
    monkeypatch.setenv("C10D_STORE_SECRET", "from-env")
    server = _server(None)
    client = c10d.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5))
    client.set("a", "b")
    monkeypatch.delenv("C10D_STORE_SECRET")
    with pytest.raises(c10d.DistNetworkError, match="shared secret"):
        c10d.TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5))


def test_server_without_secret_accepts_clients_that_send_one():
    server = _server(None)
    client = c10d.TCPStore(
        "127.0.0.1", server.port, timeout=timedelta(seconds=5), secret="anything"
    )
    client.set("x", "y")
    assert server.get("x") == b"y"
