"""When a slice pinned to Dask workers can no longer run (``somatize/pinned_workers.py``),
against a stand-in client: Dask binds a task pinned by name or address to the address that
answered at submit, and keeps a host pin as a host."""

from somatize.pinned_workers import all_gone, bound, pinned


class Client:
    def __init__(self, workers: dict[str, object]) -> None:
        self.workers = workers

    def scheduler_info(self):
        return {"workers": {a: {"name": n} for a, n in self.workers.items()}}


class Executor:  # what Dask's ClientExecutor holds
    def __init__(self, client: Client, **kwargs: object) -> None:
        self._client, self._kwargs = client, kwargs


A, B, RESTARTED = "tcp://10.0.0.1:4001", "tcp://10.0.0.2:4002", "tcp://10.0.0.1:4999"


def test_a_worker_restarted_under_its_name_at_another_address_is_gone_for_the_bound_task():
    client = Client({A: 0, B: 1})
    at_submit = bound(client, ["0"])
    assert at_submit == {A}
    assert not all_gone(client, ["0"], at_submit)
    client.workers = {RESTARTED: 0, B: 1}  # its nanny restarted it: same name, new port
    assert all_gone(client, ["0"], at_submit)  # the task waits for A: fail, and retry
    assert bound(client, ["0"]) == {RESTARTED}  # where the retry goes


def test_a_host_pin_waits_for_any_worker_of_its_host():
    client = Client({A: 0})
    at_submit = bound(client, ["10.0.0.1"])
    assert at_submit == set()  # (Dask keeps a host restriction as a host)
    client.workers = {RESTARTED: 0}
    assert not all_gone(client, ["10.0.0.1"], at_submit)
    client.workers = {B: 1}
    assert all_gone(client, ["10.0.0.1"], at_submit)


def test_a_pin_no_worker_answered_at_submit_waits_for_one_that_does():
    client = Client({B: 1})
    assert bound(client, ["gpu-box"]) == set()
    assert all_gone(client, ["gpu-box"], set())
    client.workers = {B: 1, A: "gpu-box"}
    assert not all_gone(client, ["gpu-box"], set())


def test_an_unreachable_scheduler_is_not_taken_for_a_lost_worker():
    class Down(Client):
        def scheduler_info(self):
            raise OSError("connection refused")

    assert not all_gone(Down({}), ["0"], {A})


def test_only_an_executor_restricted_to_workers_is_pinned():
    client = Client({A: 0})
    assert pinned(Executor(client, workers=["0"])) == (client, ["0"])
    assert pinned(Executor(client, workers=A)) == (client, [A])
    assert pinned(Executor(client)) is None
    assert pinned(Executor(client, workers=["0"], allow_other_workers=True)) is None
    assert pinned(object()) is None
