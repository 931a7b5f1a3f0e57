"""The client's machinery: its one background I/O thread and the connections it runs.

Everything here runs on, or hands work to, the thread of :mod:`agent_client._io.loop`:
its Redis connections (:mod:`~agent_client._io.link`), the sends and their lanes
(:mod:`~agent_client._io.send`, one module per broker: :mod:`~agent_client._io.redis_lane`,
:mod:`~agent_client._io.amqp_lane`), the reply listener
(:mod:`~agent_client._io.replies`) and the lost-call watchdog
(:mod:`~agent_client._io.watchdog`), with what the client knows of a call on its way
(:mod:`~agent_client._io.callstate`).

Nothing here is public: the modules of ``agent_client`` import from this package, and
it imports none of them but the error tree (:mod:`agent_client.errors`).
"""
