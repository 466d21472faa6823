"""An AppendService reports each failed append once, to whoever looks first: a failure a writer
awaited and handled is not raised again when the block ends; fire-and-forget appends that
failed (nobody awaited them) are, counted per journal, so that nothing is dropped unseen.
Real in-process brokers; journals that do not exist fail their appends (JOURNAL_NOT_FOUND)."""

from __future__ import annotations

import asyncio

import pytest

from broker.client.append_errors import AppendsFailedError, JournalFailedError
from broker.client.append_service import AppendService
from broker.client.async_append import AsyncAppend
from broker.client.route_cache import JournalClient
from broker.protocol.status import JournalNotFoundError
from tests.broker.broker_testkit import Cluster, journal_spec, local_content

GOOD = "once/good"
MISSING = "once/missing"
OTHER_MISSING = "once/other-missing"


async def append_line(service: AppendService, journal: str, line: bytes) -> AsyncAppend:
    aa = await service.start_append(journal)
    aa.write(line)
    aa.release()
    return aa


async def test_a_failure_the_writer_awaited_and_handled_is_not_raised_again_at_exit(
    cluster: Cluster, client: JournalClient
) -> None:
    await cluster.create(journal_spec(GOOD), cluster.brokers)
    service = AppendService(client)
    async with service:  # Leaving it raises nothing: the one failure was handled.
        lost = await append_line(service, MISSING, b"lost\n")
        with pytest.raises(JournalNotFoundError):
            await lost
        await append_line(service, GOOD, b"fine\n")
    # The service still counts it; it is only not reported twice.
    assert service.failures == {MISSING: 1}
    assert local_content(cluster.brokers[0], GOOD)[1] == b"fine\n"


async def test_a_failure_reported_by_flush_is_not_raised_again_at_exit(
    cluster: Cluster, client: JournalClient
) -> None:
    async with AppendService(client) as service:
        await append_line(service, MISSING, b"lost\n")
        with pytest.raises(AppendsFailedError) as flushed:
            await service.flush()
        assert flushed.value.failed == {MISSING: 1}
    assert service.failures == {MISSING: 1}


@pytest.mark.parametrize("cancelled", [False, True], ids=["fire-and-forget", "cancelled"])
async def test_a_failure_nobody_observed_raises_at_exit(
    cluster: Cluster, client: JournalClient, cancelled: bool
) -> None:
    # Nobody awaited it (fire and forget), or a writer cancelled its wait (asyncio.gather over
    # handles cancels them): cancelling is not seeing the error.
    service = AppendService(client)
    with pytest.raises(AppendsFailedError) as failure:
        async with service:
            handle = await append_line(service, MISSING, b"lost\n")
            if cancelled:
                handle.future.cancel()
    assert failure.value.failed == {MISSING: 1}
    assert isinstance(failure.value.__cause__, JournalNotFoundError)
    if not cancelled:
        # The handle still holds its own error for a writer that looks after all.
        with pytest.raises(JournalNotFoundError):
            await handle


async def test_a_mix_raises_naming_only_the_unobserved_failures(
    cluster: Cluster, client: JournalClient
) -> None:
    service = AppendService(client)
    with pytest.raises(AppendsFailedError) as failure:
        async with service:
            handled = await append_line(service, MISSING, b"lost\n")
            with pytest.raises(JournalNotFoundError) as seen:
                await handled
            # Two fire-and-forget batches fail too: a later one of the failed journal (sticky)
            # and one of another journal.
            later = await append_line(service, MISSING, b"after the hole\n")
            other = await append_line(service, OTHER_MISSING, b"lost too\n")
            await asyncio.wait([later.future, other.future])  # Resolved, not looked at.
    assert failure.value.failed == {MISSING: 1, OTHER_MISSING: 1}
    assert "2 append batches failed" in str(failure.value)
    assert failure.value.__cause__ is not seen.value
    assert isinstance(failure.value.__cause__, JournalFailedError | JournalNotFoundError)
    assert service.failures == {MISSING: 2, OTHER_MISSING: 1}


async def test_past_failed_kept_max_a_failure_is_reported_at_exit_even_if_awaited(
    cluster: Cluster, client: JournalClient
) -> None:
    # The service keeps at most `failed_kept_max` failed batches to learn whether a writer
    # observes them; past it, a failure is reported at the exit whatever happens to it (twice
    # rather than never).
    service = AppendService(client, failed_kept_max=1)
    with pytest.raises(AppendsFailedError) as failure:
        async with service:
            kept = await append_line(service, MISSING, b"kept\n")
            with pytest.raises(JournalNotFoundError):
                await kept
            past = await append_line(service, MISSING, b"past the bound\n")
            with pytest.raises(JournalFailedError):
                await past
    assert failure.value.failed == {MISSING: 1}
    assert isinstance(failure.value.__cause__, JournalFailedError)
    assert service.failures == {MISSING: 2}
    with pytest.raises(ValueError, match="failed_kept_max"):
        AppendService(client, failed_kept_max=0)
