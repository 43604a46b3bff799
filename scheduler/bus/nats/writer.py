"""`scheduler.operations.ports.BusWriter` on a nats-py connection: the operator half's writes."""

from __future__ import annotations

import logging

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from scheduler.operations.ports import PUBLISH_TIMEOUT, Acked, NoAnswer, NoStream, Refused

log = logging.getLogger(__name__)


class NatsWriter:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream()

    @property
    def max_payload(self) -> int:
        return int(self.nc.max_payload)

    async def store(
        self,
        subject: str,
        body: bytes,
        headers: dict[str, str] | None = None,
        timeout: float = PUBLISH_TIMEOUT,
    ) -> Acked:
        try:
            ack = await self.js.publish(subject, body, timeout=timeout, headers=headers)
        except MaxPayloadError:  # refused by the client, before a byte was sent
            limit = self.max_payload
            raise Refused(f"the message exceeds the server's max_payload ({limit} B)") from None
        except NoStreamResponseError:
            raise NoStream(f"no stream captures {subject}") from None
        except APIError as exc:  # the stream answered with an error: nothing stored
            raise Refused(str(exc.description or exc)) from None
        except (NatsError, TimeoutError) as exc:  # no answer: it may have been stored
            raise NoAnswer(type(exc).__name__) from None
        return Acked(ack.stream, ack.seq, ack.duplicate is True)

    async def notify(self, subject: str, data: bytes) -> None:
        await self.nc.publish(subject, data)

    async def held(self, subject: str) -> int | None:
        try:
            stream = await self.js.find_stream_name_by_subject(subject)
            info = await self.js.stream_info(stream, subjects_filter=subject)
        except NotFoundError:
            return None
        except (NatsError, TimeoutError) as exc:
            log.warning("nats.held_check_failed subject=%s error=%r", subject, exc)
            return None
        return int((info.state.subjects or {}).get(subject, 0))
