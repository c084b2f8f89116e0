"""The fork-server client's side of the protocol, against a scripted server on a real Unix socket.

The race it pins: a child that exits before its client sends `_DONE` is reaped by the server's
loop, which sends the peak RSS and closes at once. The client's `_DONE` then meets a closed peer
(BrokenPipeError), yet the peak is already in its receive buffer and must still be read.
"""
from __future__ import annotations

import socket
import threading
from pathlib import Path

from pipeline_src.runner.forkserver import _recv, _send, run_in_server

PID, CODE, PEAK_KIB, CPU_S = 4242, 0, 123_456, 1.25


def scripted_server(path: Path, closed: threading.Event, send_peak: bool = True) -> threading.Thread:
    """Accept one job, answer pid, exit status and (optionally) the peak, then close before the
    client can say `_DONE`: what the server does when the child died first."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        with conn, listener:
            _recv(conn)  # the job's request
            _send(conn, PID)
            _send(conn, CODE)
            if send_peak:
                _send(conn, ("exit", CODE, PEAK_KIB, CPU_S))
        closed.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_peak_sent_before_the_server_closed_survives_the_clients_broken_pipe(tmp_path):
    closed = threading.Event()
    thread = scripted_server(tmp_path / "s.sock", closed)
    # on_child runs between the pid and the exit status: wait there until the server has closed
    done = run_in_server("noop", None, on_child=lambda pid: closed.wait(10), path=tmp_path / "s.sock")
    thread.join(10)
    assert (done.code, done.peak_kib, done.cpu_s) == (CODE, PEAK_KIB, CPU_S)


def test_a_server_that_closes_without_a_peak_leaves_the_peak_unknown(tmp_path):
    closed = threading.Event()
    thread = scripted_server(tmp_path / "s.sock", closed, send_peak=False)
    done = run_in_server("noop", None, on_child=lambda pid: closed.wait(10), path=tmp_path / "s.sock")
    thread.join(10)
    assert (done.code, done.peak_kib) == (CODE, None)
