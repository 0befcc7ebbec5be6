"""REST API views: parse with an input serializer, call one service or selector, render the output.

Idempotency, authentication of writes and body checks happen before these run
(intake/idempotency/middleware.py); every object is looked up within the caller's tenant.
"""
import threading
import time
from time import monotonic

from django.urls import reverse
from django.utils.functional import cached_property
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from intake.longpoll import ENVIRON_KEY as longpoll_environ_key
from intake.longpoll import LongPoll
from intake import serializers as io
from intake.pagination import PageParams, paginate
from intake.credentials import credential_acted_for
from intake.links import portal_link_url
from intake.permissions import IsPlatformCredential, ReadByAnyWriteByPlatform, credential_is_platform
from intake import waits
from intake.problems import Conflict, Forbidden, NotFound, RecoveryInProgress, TenantRequired, TooManyWaits
from intake.tenants import (UidTaken, tenant_create, tenant_credential_issue, tenant_credential_revoke, tenant_delete,
                            tenant_get, tenant_list, tenant_update)
from webhooks import selectors
from webhooks.filters import FilterInvalid
from webhooks.conf import herald_settings
from webhooks.delivery import retries
from webhooks.models import Delivery, Endpoint
from webhooks.services import endpoints as endpoint_services
from webhooks.services import event_catalog
from webhooks.services import events as event_services
from webhooks.services import polling
from webhooks.services import portal as portal_services
from webhooks.services import recovery as recovery_services


class TenantAPIView(APIView):
    """Base view of the tenant calls of SPEC §4, mounted twice (intake/urls.py): at /api/v1/… for a tenant
    credential, and at /api/v1/tenants/{tenant}/… for a platform credential acting for that tenant.

    `self.tenant` is the one place the acting tenant is decided: the credential's own tenant, or the
    live tenant the URL names (by id or uid; 404 if there is none). Which kind of credential may call
    which family is checked before (intake/permissions.py), and once more here, by the route this view
    was reached by (`initial`): a tenant credential never acts through /tenants/{tenant}/, a platform
    credential never without it, whatever a header or a slip before made of the path.
    """

    acts_for_tenant = True
    tenant_ref: str | None = None

    def dispatch(self, request, *args, **kwargs):
        self.tenant_ref = kwargs.pop("tenant", None)
        return super().dispatch(request, *args, **kwargs)

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if self.tenant_ref is not None and not credential_is_platform(request.auth):
            raise Forbidden("A tenant credential cannot act through /api/v1/tenants; a platform credential can.")
        if self.tenant_ref is None and credential_is_platform(request.auth):
            raise TenantRequired()

    @cached_property
    def tenant(self):
        if self.tenant_ref is None:
            return self.request.auth.tenant
        tenant = self.found(_acting_tenant(self.request, self.tenant_ref))
        # this credential's next requests for this tenant wait for a thread in a queue of their own
        credential_acted_for(credential_id=self.request.auth.pk, ref=self.tenant_ref, tenant_id=tenant.pk)
        return tenant

    def location(self, name: str, *args) -> str:
        """The URL of a named route, in the family this request came in by."""
        if self.tenant_ref is None:
            return reverse(name, args=args)
        return reverse(f"acting:{name}", args=[self.tenant_ref, *args])

    @staticmethod
    def found(obj):
        if obj is None:
            raise NotFound()
        return obj

    def page(self, queryset, serializer_class):
        rows, next_cursor = paginate(queryset, query_params=self.request.query_params)
        return Response({"data": serializer_class(rows, many=True).data, "next_cursor": next_cursor})


def _acting_tenant(request, ref: str):
    """The live tenant `ref` names (id or uid), or None. Where the idempotency layer resolved it for this
    request's key (intake/idempotency/middleware.py), that tenant by its id, if still live: the key and the
    work name one tenant, even were the uid given to another meanwhile."""
    resolved = getattr(request, "herald_tenant", None)
    if resolved is not None and ref in (resolved.pk, resolved.uid):
        ref = resolved.pk
    return tenant_get(ref=ref)


def _validated(serializer_class, data, **kwargs) -> dict:
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _refused_url(exc: endpoint_services.EndpointUrlRefused) -> serializers.ValidationError:
    return serializers.ValidationError({"url": [str(exc)]})


def _refused_access(exc: endpoint_services.EndpointAccessRefused) -> serializers.ValidationError:
    return serializers.ValidationError({exc.field: [str(exc)]})


def _refused_filter(exc: FilterInvalid) -> serializers.ValidationError:
    """A filter that cannot be used: keyed by the JSON pointer of the offending part (`/filter/data/amount/$gt`)."""
    return serializers.ValidationError({"/filter" + exc.pointer: [str(exc)]})


class EndpointListCreateView(TenantAPIView):
    """GET: the tenant's endpoints. POST: create one (its signing secret: `GET …/secret`)."""

    @extend_schema(operation_id="endpoints_list", parameters=[PageParams], responses=io.EndpointPageOutput)
    def get(self, request):
        return self.page(selectors.endpoint_list(tenant=self.tenant), io.EndpointOutput)

    @extend_schema(operation_id="endpoints_create", request=io.EndpointCreateInput, responses={201: io.EndpointOutput})
    def post(self, request):
        data = _validated(io.EndpointCreateInput, request.data)
        try:
            endpoint = endpoint_services.endpoint_create(tenant=self.tenant, **data)
        except endpoint_services.EndpointUrlRefused as exc:
            raise _refused_url(exc) from None
        except endpoint_services.EndpointQuotaExceeded as exc:  # SPEC §1: 400 validation_error
            raise serializers.ValidationError({"endpoints": [str(exc)]}) from None
        except endpoint_services.TenantGone:
            raise NotFound() from None
        except endpoint_services.EndpointAccessRefused as exc:
            raise _refused_access(exc) from None
        except FilterInvalid as exc:
            raise _refused_filter(exc) from None
        return Response(io.EndpointOutput(endpoint).data, status=status.HTTP_201_CREATED,
                        headers={"Location": self.location("endpoint-detail", endpoint.id)})


class EndpointDetailView(TenantAPIView):
    """GET, PATCH or DELETE one endpoint; DELETE cancels its pending deliveries."""

    @extend_schema(operation_id="endpoints_retrieve", responses=io.EndpointOutput)
    def get(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        return Response(io.EndpointOutput(endpoint).data)

    @extend_schema(operation_id="endpoints_update", request=io.EndpointUpdateInput, responses=io.EndpointOutput)
    def patch(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        data = _validated(io.EndpointUpdateInput, request.data, partial=True)
        try:
            endpoint = endpoint_services.endpoint_update(endpoint=endpoint, **data)
        except endpoint_services.EndpointUrlRefused as exc:
            raise _refused_url(exc) from None
        except endpoint_services.EndpointAccessRefused as exc:
            raise _refused_access(exc) from None
        except FilterInvalid as exc:
            raise _refused_filter(exc) from None
        return Response(io.EndpointOutput(endpoint).data)

    @extend_schema(operation_id="endpoints_delete", responses={204: None})
    def delete(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        endpoint_services.endpoint_delete(endpoint=endpoint)
        return Response(status=status.HTTP_204_NO_CONTENT)


class EndpointSecretView(TenantAPIView):
    """GET: the endpoint's current signing secret (`{secret}`), or for a v1a endpoint its public key
    (`{public_key}`; the private key is never returned): the only call that returns one (never cached)."""

    @extend_schema(operation_id="endpoints_secret", responses=io.EndpointSecretOutput)
    def get(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        return Response(selectors.endpoint_secret_shown(endpoint=endpoint), headers={"Cache-Control": "no-store"})


class EndpointRotateSecretView(TenantAPIView):
    """POST: issue a new secret (read it from `GET …/secret`); the previous one keeps signing for 24 h."""

    @extend_schema(operation_id="endpoints_rotate_secret", request=None, responses=io.EndpointOutput)
    def post(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        endpoint = endpoint_services.endpoint_rotate_secret(endpoint=endpoint)
        return Response(io.EndpointOutput(endpoint).data)


class EndpointTestView(TenantAPIView):
    """POST: send a `herald.test` event to this endpoint only; answered like POST /events."""

    @extend_schema(operation_id="endpoints_test", request=None, responses={202: io.EventOutput})
    def post(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        event = event_services.event_send_test(endpoint=endpoint)
        return Response(io.EventOutput(event).data, status=status.HTTP_202_ACCEPTED,
                        headers={"Location": self.location("event-detail", event.id)})


class EndpointMessagesView(TenantAPIView):
    """GET: a poll endpoint's next messages (SPEC §12), each with the headers and body a POST would carry;
    `after=C` acknowledges those served up to cursor C. With nothing to serve and `wait`, the answer waits
    for a message, in gunicorn's event loop rather than on a thread (intake/longpoll.py)."""

    @extend_schema(operation_id="endpoints_messages", parameters=[io.MessagesQueryInput],
                   responses=io.MessagePageOutput)
    def get(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        query = _validated(io.MessagesQueryInput, request.query_params)
        if endpoint.kind != Endpoint.POLL:
            raise serializers.ValidationError({"endpoint": [
                "Not a poll endpoint: Herald POSTs its messages to its URL. Create one with {\"kind\": \"poll\"}."]})
        longpoll: LongPoll | None = request.META.get(longpoll_environ_key)
        after, limit = query.get("after", 0), query["limit"]
        deadline = longpoll.deadline if longpoll is not None and longpoll.deadline is not None else None
        if deadline is None:
            deadline = monotonic() + query["wait"]
        # A poll that may wait takes its place under POLL_MAX_WAITS_* first, so that one over a cap is answered
        # at once and costs nothing more (no transaction, no lock on the endpoint); one that finds messages
        # gives its place back when it is answered (ParkingApp, or below).
        wait = longpoll.wait if longpoll is not None else None
        if query["wait"] > 0 and wait is None:
            if longpoll is not None:
                longpoll.refused = True   # a 429 from here closes the connection
            wait = _take_wait(request, endpoint, deadline)
            if longpoll is not None:
                longpoll.refused, longpoll.wait = False, wait
        try:
            since = monotonic()
            page = polling.endpoint_messages(endpoint=endpoint, after=after, limit=limit)
            if not page.messages and deadline - monotonic() > 0.01:
                if longpoll is not None:
                    # the worker waits for a NOTIFY of this endpoint (or the deadline), then runs this again
                    longpoll.park(key=endpoint.pk, deadline=deadline, since=since)
                else:
                    page = _wait_on_thread(endpoint=endpoint, after=after, limit=limit, deadline=deadline) or page
        finally:
            if longpoll is None:
                waits.release(wait)
        return Response({"data": [{"delivery_id": m.delivery_id, "headers": m.headers, "body": m.body}
                                  for m in page.messages], "next_cursor": page.next_cursor},
                        headers={"Cache-Control": "no-store"})


def _take_wait(request, endpoint, deadline: float) -> waits.Wait:
    """A place for this long-poll under POLL_MAX_WAITS_PER_CREDENTIAL and POLL_MAX_WAITS_PER_ENDPOINT, or
    429 `too_many_waits` at once (intake/waits.py)."""
    try:
        return waits.counter().take(credential_id=request.auth.id, endpoint_id=endpoint.pk,
                                    seconds=max(deadline - monotonic(), 0.0))
    except waits.WaitsFull as full:
        owner = "This credential" if full.which == "credential" else "This endpoint"
        raise TooManyWaits(f"{owner} already has {full.cap} long-polls waiting "
                           f"(POLL_MAX_WAITS_PER_{full.which.upper()}); retry in {full.retry_after} s, "
                           "or poll without `wait`.", wait=full.retry_after) from None


_thread_waiters = threading.BoundedSemaphore(max(herald_settings.polling.POLL_THREAD_WAITERS, 1))


def _wait_on_thread(*, endpoint, after: int, limit: int, deadline: float) -> polling.MessagePage | None:
    """Where the worker cannot park the request: look again every POLL_THREAD_RECHECK_SECONDS until the
    deadline, on this thread; at most POLL_THREAD_WAITERS such waits at once (the rest: None at once)."""
    if herald_settings.polling.POLL_THREAD_WAITERS <= 0 or not _thread_waiters.acquire(blocking=False):
        return None
    try:
        while (left := deadline - monotonic()) > 0:
            time.sleep(min(left, herald_settings.polling.POLL_THREAD_RECHECK_SECONDS))
            page = polling.endpoint_messages(endpoint=endpoint, after=after, limit=limit)
            if page.messages:
                return page
        return None
    finally:
        _thread_waiters.release()


class EndpointRecoverView(TenantAPIView):
    """POST: resend every failed delivery of this endpoint whose event was created in [since, until), in
    event order, in the background; follow it at `GET /api/v1/recoveries/{id}`."""

    @extend_schema(operation_id="endpoints_recover", request=io.RecoveryCreateInput,
                   responses={202: io.RecoveryOutput})
    def post(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        data = _validated(io.RecoveryCreateInput, request.data)
        try:
            recovery = recovery_services.recovery_create(tenant=self.tenant, endpoint=endpoint, **data)
        except recovery_services.RecoveryInProgress as exc:
            raise RecoveryInProgress(str(exc)) from None
        except recovery_services.RecoveryRefused as exc:
            raise Conflict(str(exc)) from None
        return Response(io.RecoveryOutput(recovery).data, status=status.HTTP_202_ACCEPTED,
                        headers={"Location": reverse("recovery-detail", args=[recovery.id])})


class RecoveryDetailView(TenantAPIView):
    """GET a recovery's progress: `status` ends as `completed`."""

    @extend_schema(operation_id="recoveries_retrieve", responses=io.RecoveryOutput)
    def get(self, request, recovery_id):
        recovery = self.found(selectors.recovery_get(tenant=self.tenant, recovery_id=recovery_id))
        return Response(io.RecoveryOutput(recovery).data)


class PortalLinkView(TenantAPIView):
    """POST: a one-time link to the tenant's portal, valid for PORTAL_LINK_SECONDS."""

    @extend_schema(operation_id="portal_links_create", request=io.PortalLinkInput, responses={201: io.PortalLinkOutput})
    def post(self, request):
        data = _validated(io.PortalLinkInput, request.data)
        link, token = portal_services.portal_link_create(tenant=self.tenant, credential_id=request.auth.pk,
                                                         theme=data.get("theme"))
        response = Response({"url": portal_link_url(request, token), "expires_at": link.expires_at},
                            status=status.HTTP_201_CREATED)
        response.carries_secret = True  # the link is a bearer secret: its stored replay is encrypted at rest
        return response


class EventListCreateView(TenantAPIView):
    """GET: events with their delivery statuses (`?type=`, `?created_after=`, `?created_before=`). POST: record an event and fan it out."""

    @extend_schema(operation_id="events_list", parameters=[io.EventFilterInput, PageParams],
                   responses=io.EventPageOutput)
    def get(self, request):
        filters = _validated(io.EventFilterInput, request.query_params)
        events = selectors.event_list(tenant=self.tenant, event_type=filters.get("type"),
                                      created_after=filters.get("created_after"),
                                      created_before=filters.get("created_before"))
        return self.page(events, io.EventOutput)

    @extend_schema(operation_id="events_create", request=io.EventCreateInput, responses={202: io.EventOutput})
    def post(self, request):
        data = io.event_create_input(request.data) or _validated(io.EventCreateInput, request.data)
        try:
            event = event_services.event_ingest(tenant=self.tenant, event_type=data["type"], data=data["data"],
                                                channels=data["channels"])
        except event_services.EventDataInvalid as exc:  # the insert rolls back with this 400
            raise serializers.ValidationError(exc.errors) from None
        return Response(io.EventOutput(event).data, status=status.HTTP_202_ACCEPTED,
                        headers={"Location": self.location("event-detail", event.id)})


class EventBatchCreateView(TenantAPIView):
    """POST: record 1 to 500 events at once, all or nothing, answered in the order sent (SPEC §4)."""

    @extend_schema(operation_id="events_batch_create", request=io.EventBatchCreateInput,
                   responses={202: io.EventBatchOutput})
    def post(self, request):
        events = io.event_batch_input(request.data)
        try:
            made = event_services.event_ingest_many(tenant=self.tenant, events=events)
        except event_services.EventDataInvalid as exc:  # every insert rolls back with this 400
            raise serializers.ValidationError(exc.errors) from None
        output = io.EventOutput()
        return Response({"data": [output.to_representation(event) for event in made]},
                        status=status.HTTP_202_ACCEPTED)


class EventDetailView(TenantAPIView):
    """GET one event with its current delivery statuses."""

    @extend_schema(operation_id="events_retrieve", responses=io.EventOutput)
    def get(self, request, event_id):
        event = self.found(selectors.event_get(tenant=self.tenant, event_id=event_id))
        return Response(io.EventOutput(event).data)


class DeliveryListView(TenantAPIView):
    """GET deliveries, newest first; filter by `?status=`, `?endpoint=`, `?event=`, `?created_after=`,
    `?created_before=`."""

    @extend_schema(operation_id="deliveries_list", parameters=[io.DeliveryFilterInput, PageParams],
                   responses=io.DeliveryPageOutput)
    def get(self, request):
        filters = _validated(io.DeliveryFilterInput, request.query_params)
        deliveries = selectors.delivery_list(tenant=self.tenant, status=filters.get("status"),
                                             endpoint_id=filters.get("endpoint"), event_id=filters.get("event"),
                                             created_after=filters.get("created_after"),
                                             created_before=filters.get("created_before"))
        return self.page(deliveries, io.DeliveryOutput)


class DeliveryDetailView(TenantAPIView):
    """GET one delivery with every attempt it made."""

    @extend_schema(operation_id="deliveries_retrieve", responses=io.DeliveryDetailOutput)
    def get(self, request, delivery_id):
        delivery = self.found(selectors.delivery_get(tenant=self.tenant, delivery_id=delivery_id))
        return Response(io.DeliveryDetailOutput(delivery).data)


class DeliveryRetryView(TenantAPIView):
    """POST: send a failed or succeeded delivery again now; a pending one is left as it is."""

    @extend_schema(operation_id="deliveries_retry", request=None, responses={202: io.DeliveryOutput})
    def post(self, request, delivery_id):
        delivery = self.found(selectors.delivery_get(tenant=self.tenant, delivery_id=delivery_id))
        try:
            delivery = retries.delivery_retry(delivery=delivery)
        except Delivery.DoesNotExist:  # deleted by retention (past EVENT_RETENTION_DAYS) meanwhile
            raise NotFound() from None
        return Response(io.DeliveryOutput(delivery).data, status=status.HTTP_202_ACCEPTED)


class EventTypeListCreateView(APIView):
    """GET: the deployment's event-type catalog (any credential). POST: add a type (platform credential)."""

    permission_classes = [ReadByAnyWriteByPlatform]
    problems = {"403": "`forbidden`: writing the catalog takes a platform credential",
                "409": "`conflict`: an event type of this name exists"}

    @extend_schema(operation_id="event_types_list", parameters=[PageParams], responses=io.EventTypePageOutput)
    def get(self, request):
        rows, next_cursor = paginate(selectors.event_type_list(), query_params=request.query_params)
        return Response({"data": io.EventTypeOutput(rows, many=True).data, "next_cursor": next_cursor})

    @extend_schema(operation_id="event_types_create", request=io.EventTypeCreateInput,
                   responses={201: io.EventTypeOutput})
    def post(self, request):
        data = _validated(io.EventTypeCreateInput, request.data)
        try:
            event_type = event_catalog.event_type_create(**data)
        except event_catalog.EventTypeInvalid as exc:
            raise serializers.ValidationError(exc.errors) from None
        except event_catalog.EventTypeExists:
            raise Conflict(f"The event type {data['name']!r} exists already.") from None
        return Response(io.EventTypeOutput(event_type).data, status=status.HTTP_201_CREATED,
                        headers={"Location": reverse("event-type-detail", args=[event_type.name])})


class EventTypeDetailView(APIView):
    """GET, PATCH or DELETE one catalog entry by name (platform credential)."""

    permission_classes = [IsPlatformCredential]
    problems = {"403": "`forbidden`: one entry is read and changed with a platform credential (any credential "
                       "reads the list)"}

    @staticmethod
    def found(name):
        event_type = selectors.event_type_get(name=name)
        if event_type is None:
            raise NotFound()
        return event_type

    @extend_schema(operation_id="event_types_retrieve", responses=io.EventTypeOutput)
    def get(self, request, name):
        return Response(io.EventTypeOutput(self.found(name)).data)

    @extend_schema(operation_id="event_types_update", request=io.EventTypeUpdateInput, responses=io.EventTypeOutput)
    def patch(self, request, name):
        event_type = self.found(name)
        data = _validated(io.EventTypeUpdateInput, request.data, partial=True)
        try:
            event_type = event_catalog.event_type_update(event_type=event_type, **data)
        except event_catalog.EventTypeInvalid as exc:
            raise serializers.ValidationError(exc.errors) from None
        return Response(io.EventTypeOutput(event_type).data)

    @extend_schema(operation_id="event_types_delete", responses={204: None})
    def delete(self, request, name):
        event_catalog.event_type_delete(event_type=self.found(name))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- Platform API (SPEC §10): a platform credential only (intake/permissions.py) ----------------------
def _tenant_output(tenant) -> dict:
    return io.TenantOutput(tenant).data


class PlatformAPIView(APIView):
    """Base view of the calls on tenants themselves; `{tenant}` is an id (`tnt_…`) or a uid. A platform
    credential only: checked by the scope rule (intake/permissions.py) and again here, by this view's own
    permission, whatever the path looked like."""

    permission_classes = [IsPlatformCredential]

    def found_tenant(self, ref: str):
        tenant = _acting_tenant(self.request, ref)
        if tenant is None:
            raise NotFound()
        return tenant


class TenantListCreateView(PlatformAPIView):
    """GET: the tenants, newest first (`?uid=` finds one by your own id). POST: create one."""

    @extend_schema(operation_id="tenants_list", parameters=[io.TenantFilterInput, PageParams],
                   responses=io.TenantPageOutput)
    def get(self, request):
        filters = _validated(io.TenantFilterInput, request.query_params)
        rows, next_cursor = paginate(tenant_list(uid=filters.get("uid")), query_params=request.query_params)
        return Response({"data": [_tenant_output(t) for t in rows], "next_cursor": next_cursor})

    @extend_schema(operation_id="tenants_create", request=io.TenantCreateInput, responses={201: io.TenantOutput})
    def post(self, request):
        data = _validated(io.TenantCreateInput, request.data)
        try:
            tenant = tenant_create(**data)
        except UidTaken:
            raise Conflict(f"A tenant with uid {data['uid']!r} exists already.") from None
        return Response(_tenant_output(tenant), status=status.HTTP_201_CREATED,
                        headers={"Location": reverse("tenant-detail", args=[tenant.id])})


class TenantDetailView(PlatformAPIView):
    """GET or PATCH one tenant; DELETE stops it at once and erases everything it owns (202)."""

    @extend_schema(operation_id="tenants_retrieve", responses=io.TenantOutput)
    def get(self, request, tenant):
        return Response(_tenant_output(self.found_tenant(tenant)))

    @extend_schema(operation_id="tenants_update", request=io.TenantUpdateInput, responses=io.TenantOutput)
    def patch(self, request, tenant):
        found = self.found_tenant(tenant)
        data = _validated(io.TenantUpdateInput, request.data, partial=True)
        return Response(_tenant_output(tenant_update(tenant=found, **data)))

    @extend_schema(operation_id="tenants_delete", responses={202: io.TenantOutput})
    def delete(self, request, tenant):
        found = self.found_tenant(tenant)
        return Response(_tenant_output(tenant_delete(tenant=found)), status=status.HTTP_202_ACCEPTED)


class TenantCredentialCreateView(PlatformAPIView):
    """POST: a new tenant credential for this tenant; its token is in this answer only."""

    @extend_schema(operation_id="tenants_credentials_create", request=None, responses={201: io.CredentialOutput})
    def post(self, request, tenant):
        try:
            credential, token = tenant_credential_issue(tenant=self.found_tenant(tenant))
        except endpoint_services.TenantGone:  # deleted while this call was under way
            raise NotFound() from None
        response = Response(io.CredentialOutput({"public_id": credential.public_id, "token": token,
                                                 "created_at": credential.created_at}).data,
                            status=status.HTTP_201_CREATED, headers={"Cache-Control": "no-store"})
        response.carries_secret = True  # the token: its stored replay is encrypted at rest
        return response


class TenantCredentialDetailView(PlatformAPIView):
    """DELETE: revoke one of the tenant's credentials; the portal sessions it opened end too."""

    @extend_schema(operation_id="tenants_credentials_revoke", responses={204: None})
    def delete(self, request, tenant, credential_id):
        found = self.found_tenant(tenant)
        number = credential_id.removeprefix("cred_")
        if not number.isdigit() or len(number) > 18 or not tenant_credential_revoke(
                tenant=found, credential_id=int(number)):
            raise NotFound()
        return Response(status=status.HTTP_204_NO_CONTENT)
