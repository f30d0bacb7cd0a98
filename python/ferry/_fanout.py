"""ferry.select: fan-in from many receivers, as an iterator over a ferry.Selector."""

from ._ferry import ChannelClosed, PeerDied, Selector

__all__ = ["select"]


def select(receivers, timeout=None):
    """Yields ``(index, message)`` from ``receivers`` (a list of Receiver or Duplex) as
    messages arrive, until every stream has ended; ``index`` is the receiver's position.

    Ready receivers are served in turn, so a busy one cannot starve the others. A receiver
    whose sender vanished raises :class:`ferry.PeerDied`; ``timeout`` (seconds) bounds
    each wait for the next message (``TimeoutError``; None waits for ever).
    """
    selector = Selector()
    ends = [getattr(rx, "receiver", rx) for rx in receivers]
    position = {selector.add(rx): i for i, rx in enumerate(ends)}
    while len(selector):
        index = selector.wait(timeout)
        if index is None:
            raise TimeoutError(f"ferry.select: no message within {timeout} s")
        try:
            message = ends[position[index]].recv()
        except PeerDied:
            raise
        except ChannelClosed:
            selector.remove(index)
            continue
        yield position[index], message
