"""The admin API of the event schemas (``tidemq ctl schemas``), JSON Schemas by name (an event
type), every version kept, behind the operator guard of ``/admin/`` (app.py):

    GET    /admin/schemas                   every schema: name, current version
    GET    /admin/schemas/{name}[?version=N] the schema (its current version, or version N)
    PUT    /admin/schemas/{name}            the body, a JSON Schema, as the next version
    DELETE /admin/schemas/{name}            every version (refused while a rule names it)

A schema that is not a valid JSON Schema is a 400 naming the problem.
"""

from __future__ import annotations

import json

from aiohttp import web

from .deps import RulesControl, RulesPlace
from .errors import AdminError
from .rules_api import not_here


def add_routes(app: web.Application, rules: RulesControl | None, place: RulesPlace | None = None) -> None:
    api = SchemasApi(rules, place)
    app.router.add_get("/admin/schemas", api.list)
    app.router.add_get("/admin/schemas/{name:.+}", api.get)
    app.router.add_put("/admin/schemas/{name:.+}", api.put)
    app.router.add_delete("/admin/schemas/{name:.+}", api.delete)


class SchemasApi:
    def __init__(self, rules: RulesControl | None, place: RulesPlace | None = None) -> None:
        self._rules = rules
        self._place = place

    async def _engine(self) -> RulesControl:
        if self._rules is None:
            raise await not_here(self._place, "event schemas")
        return self._rules

    async def list(self, request: web.Request) -> web.Response:
        return web.json_response((await self._engine()).schemas.list())

    async def get(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        raw = request.query.get("version")
        try:
            version = int(raw) if raw is not None else None
        except ValueError:
            raise AdminError(400, f"version must be a number, not {raw!r}") from None
        row = (await self._engine()).schemas.get(name, version)
        if row is None:
            raise AdminError(404, f"no schema named {name!r}" + (f" at version {version}" if version else ""))
        return web.json_response(row)

    async def put(self, request: web.Request) -> web.Response:
        engine = (await self._engine())
        try:
            schema = json.loads(await request.read())
        except (ValueError, RecursionError) as exc:
            raise AdminError(400, f"the body is not JSON: {exc!r}" if isinstance(exc, RecursionError)
                             else f"the body is not JSON: {exc}") from None
        try:
            row = engine.put_schema(request.match_info["name"], schema)
        except ValueError as exc:
            raise AdminError(400, getattr(exc, "reason", str(exc))) from None
        return web.json_response(row, status=201 if row["version"] == 1 else 200)

    async def delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            (await self._engine()).delete_schema(name)
        except LookupError as exc:
            raise AdminError(404, str(exc)) from None
        except ValueError as exc:
            raise AdminError(409, getattr(exc, "reason", str(exc))) from None
        return web.json_response({"deleted": name})
