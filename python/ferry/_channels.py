"""ferry.channel and ferry.duplex: connected ends made in this process, to keep one and
hand the other to a worker (ferry.spawn) or another thread."""

from . import _ferry

__all__ = ["Duplex", "channel", "duplex"]

_OPTIONS_DOC = """
    Transports, named as C++'s ``transport_name()``: ``"shm_ring"`` (a ring buffer in shared
    memory), ``"unix_socket"`` (``"unix"`` is another name of it), ``"pipe"``, and
    ``"in_process"`` (between threads of this process). Options, keyword arguments with the
    names and defaults of C++'s ``ChannelOptions`` (durations in seconds):
    ``ring_capacity`` (bytes, 1 MiB), ``ring_spin`` (20 us on a machine with several
    CPUs), ``peer_check_interval`` (0.1), ``queue_capacity`` (1024, in_process),
    ``close_linger`` (10.0), ``limits`` (a dict of ``max_body_bytes``, ``max_handles``,
    ``max_segments``, ``max_fds``, ``max_releases``, ``max_type_name_bytes``) and ``name``
    (a label for the ends in ``ferry.snapshot()`` and ``ferry ps``; empty).
"""


def channel(transport="shm_ring", **options):
    """A connected ``(Sender, Receiver)`` pair of ferry.Value messages."""
    return _ferry._make_channel(transport, options)


channel.__doc__ += _OPTIONS_DOC


class Duplex:
    """One end of a duplex connection: sends to the other end and receives from it.

    ``sender`` and ``receiver`` are an ordinary :class:`ferry.Sender` and
    :class:`ferry.Receiver`; either can be handed on alone. Closing one half ends only its
    direction. Iteration yields the messages received until the other end closes.
    """

    __slots__ = ("sender", "receiver")

    def __init__(self, sender, receiver):
        self.sender = sender
        self.receiver = receiver

    def send(self, message):
        """Sends ``message`` to the other end (Sender.send)."""
        self.sender.send(message)

    def recv(self):
        """The next message from the other end (Receiver.recv); ChannelClosed once it closed."""
        return self.receiver.recv()

    def recv_for(self, timeout):
        """Like recv(), waiting at most ``timeout`` seconds (TimeoutError)."""
        return self.receiver.recv_for(timeout)

    def call(self, request):
        """Sends ``request`` and returns the other end's next message: one round trip.

        Raises ChannelClosed when the other end closed its sending half instead of replying.
        """
        self.sender.send(request)
        return self.receiver.recv()

    def call_for(self, request, timeout):
        """Like call(), waiting at most ``timeout`` seconds in all (for room to send the
        request, then for the reply; None: no limit); raises TimeoutError when the time ran
        out, ChannelClosed when close() in another thread ended the wait.

        A reply that comes late is not dropped: the next recv() or call() returns it, ahead
        of the reply to a later request (take it with recv_for(), or put an id in messages).
        """
        return _ferry._call_for(self.sender, self.receiver, request, timeout)

    def close(self):
        """Ends both directions: the other end sees end of stream after what was sent."""
        try:
            self.sender.close()
        finally:
            self.receiver.close()

    @property
    def is_open(self):
        """True while either half is open."""
        return self.sender.is_open or self.receiver.is_open

    def __iter__(self):
        return iter(self.receiver)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<ferry.Duplex open={self.is_open}>"


Duplex.__module__ = "ferry"  # as users name it


def duplex(transport="shm_ring", **options):
    """A connected pair of :class:`Duplex` ends: what one sends, the other receives.

    Over ``"unix_socket"`` both directions share one socket pair; over ``"shm_ring"`` and
    ``"pipe"`` each direction has a transport of its own.
    """
    (a_sender, a_receiver), (b_sender, b_receiver) = _ferry._make_duplex(transport, options)
    return Duplex(a_sender, a_receiver), Duplex(b_sender, b_receiver)


duplex.__doc__ += _OPTIONS_DOC
