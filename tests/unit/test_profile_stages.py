"""How ``python -m bench.profile`` reads py-spy's samples (bench/profile.py)."""

from __future__ import annotations

from bench.profile import OTHER, Profile, classify, parse, render


def test_a_sample_belongs_to_the_stage_of_its_deepest_known_frame() -> None:
    strategy = "task_message_handler (celery/worker/strategy.py:145)"
    read = "_blmpop_read (executor/seams/transport.py:389)"
    deliver = "_push_replies (executor/delivery.py:120)"
    redis = "execute (redis/client.py:2412)"

    assert classify([read, strategy, redis]) == "Celery's request and strategy"
    assert classify([read, redis]) == "read and decode the queue"
    assert classify(["run (threading.py:982)", deliver, redis]) == "deliver the outcome"
    assert classify(["run (threading.py:982)", redis]) == OTHER


def test_samples_are_counted_by_process_role_and_thread_and_waiting_ones_left_out() -> None:
    parent, child = 'process 10:"celery worker"', 'process 20:"celery worker"'
    lines = [
        (f"{parent};thread (11): MainThread", "_brpop_read (executor/seams/transport.py:270)", 7),
        (
            f"{parent};thread (11): MainThread",
            "Hub.create_loop (kombu/asynchronous/hub.py:406);_epoll.poll (eventio.py:83)",
            50,
        ),
        (f"{parent};thread (12): toolexec-tool_3", "run_call (executor/task.py:136)", 2),
        (f"{parent};thread (13): toolexec-tool_4", "run_call (executor/task.py:136)", 1),
        (f"{parent};{child};thread (21): MainThread", "execute (executor/runner.py:111)", 4),
    ]
    raw = "\n".join(f"{where};{frames} {count}" for where, frames, count in lines)

    found = parse(raw, root_pid=10)

    assert found == {
        ("main process", "MainThread"): {"read and decode the queue": 7},
        ("main process", "toolexec-tool_*"): {"run the call": 3},
        ("child process", "(every child)"): {"run the call": 4},
    }
    table = render(Profile(found, rate=100, calls=10), "test")
    # 7 samples at 100 a second over 10 calls: 7 ms per call.
    assert "| main process | MainThread | 0.000 | 0.000 | 0.000 | 0.000 | 7.000 |" in table
