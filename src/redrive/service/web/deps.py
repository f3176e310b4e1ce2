"""What the routes are given: the few collaborators each needs, as dependencies.

`create_app` sets up one `Collaborators` on the app (`app.state.collaborators`); the
small functions below hand each route the part it asks for, with `Depends`. No
route sees the service object.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry

from redrive.service.actions import OperatorActions
from redrive.service.auth import Tokens
from redrive.service.config import ServiceSettings
from redrive.service.operations import Operations
from redrive.service.store import Store
from redrive.service.web.templating import Pages


@dataclass(frozen=True, slots=True)
class Collaborators:
    settings: ServiceSettings
    store: Store
    operations: Operations
    tokens: Tokens
    actions: OperatorActions
    pages: Pages
    registry: CollectorRegistry
    readiness: Callable[[], dict[str, bool]]


def collaborators(request: Request) -> Collaborators:
    found: Collaborators = request.app.state.collaborators
    return found


async def _settings(request: Request) -> ServiceSettings:
    return collaborators(request).settings


async def _store(request: Request) -> Store:
    return collaborators(request).store


async def _operations(request: Request) -> Operations:
    return collaborators(request).operations


async def _tokens(request: Request) -> Tokens:
    return collaborators(request).tokens


async def _actions(request: Request) -> OperatorActions:
    return collaborators(request).actions


async def _pages(request: Request) -> Pages:
    return collaborators(request).pages


Settings = Annotated[ServiceSettings, Depends(_settings)]
StoreDep = Annotated[Store, Depends(_store)]
Ops = Annotated[Operations, Depends(_operations)]
TokenBook = Annotated[Tokens, Depends(_tokens)]
Actions = Annotated[OperatorActions, Depends(_actions)]
PagesDep = Annotated[Pages, Depends(_pages)]
