"""REST API views: parse with an input serializer, call one service or selector, render the output.

Idempotency, authentication of writes and body checks happen before these run
(intake/idempotency/middleware.py); every object is looked up within the caller's tenant.
"""
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from intake import serializers as io
from intake.pagination import PageParams, paginate
from intake.problems import NotFound
from portal.links import portal_link_url
from webhooks import selectors
from webhooks.models import Delivery
from webhooks.services import delivery as delivery_services
from webhooks.services import endpoints as endpoint_services
from webhooks.services import events as event_services
from webhooks.services import portal as portal_services


class TenantAPIView(APIView):
    """Base view: `self.tenant` is the tenant of the authenticated credential."""

    @property
    def tenant(self):
        return self.request.auth.tenant

    @staticmethod
    def found(obj):
        if obj is None:
            raise NotFound()
        return obj

    def page(self, queryset, serializer_class):
        rows, next_cursor = paginate(queryset, query_params=self.request.query_params)
        return Response({"data": serializer_class(rows, many=True).data, "next_cursor": next_cursor})


def _validated(serializer_class, data, **kwargs) -> dict:
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _refused_url(exc: endpoint_services.EndpointUrlRefused) -> serializers.ValidationError:
    return serializers.ValidationError({"url": [str(exc)]})


def _refused_access(exc: endpoint_services.EndpointAccessRefused) -> serializers.ValidationError:
    return serializers.ValidationError({exc.field: [str(exc)]})


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
        except endpoint_services.EndpointAccessRefused as exc:
            raise _refused_access(exc) from None
        return Response(io.EndpointOutput(endpoint).data, status=status.HTTP_201_CREATED,
                        headers={"Location": reverse("endpoint-detail", args=[endpoint.id])})


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
        return Response(io.EndpointOutput(endpoint).data)

    @extend_schema(operation_id="endpoints_delete", responses={204: None})
    def delete(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        endpoint_services.endpoint_delete(endpoint=endpoint)
        return Response(status=status.HTTP_204_NO_CONTENT)


class EndpointSecretView(TenantAPIView):
    """GET: the endpoint's current signing secret: the only call that returns one (never cached)."""

    @extend_schema(operation_id="endpoints_secret", responses=io.EndpointSecretOutput)
    def get(self, request, endpoint_id):
        endpoint = self.found(selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id))
        return Response({"secret": selectors.endpoint_secret(endpoint=endpoint)},
                        headers={"Cache-Control": "no-store"})


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
                        headers={"Location": reverse("event-detail", args=[event.id])})


class PortalLinkView(TenantAPIView):
    """POST: a one-time link to the tenant's portal, valid for PORTAL_LINK_SECONDS."""

    @extend_schema(operation_id="portal_links_create", request=None, responses={201: io.PortalLinkOutput})
    def post(self, request):
        link, token = portal_services.portal_link_create(tenant=self.tenant)
        response = Response({"url": portal_link_url(request, token), "expires_at": link.expires_at},
                            status=status.HTTP_201_CREATED)
        response.carries_secret = True  # the link is a bearer secret: its stored replay is encrypted at rest
        return response


class EventListCreateView(TenantAPIView):
    """GET: events with their delivery statuses (`?type=`). POST: record an event and fan it out."""

    @extend_schema(operation_id="events_list", parameters=[io.EventFilterInput, PageParams],
                   responses=io.EventPageOutput)
    def get(self, request):
        filters = _validated(io.EventFilterInput, request.query_params)
        events = selectors.event_list(tenant=self.tenant, event_type=filters.get("type"))
        return self.page(events, io.EventOutput)

    @extend_schema(operation_id="events_create", request=io.EventCreateInput, responses={202: io.EventOutput})
    def post(self, request):
        data = io.event_create_input(request.data) or _validated(io.EventCreateInput, request.data)
        event = event_services.event_ingest(tenant=self.tenant, event_type=data["type"], data=data["data"],
                                            channels=data["channels"])
        return Response(io.EventOutput(event).data, status=status.HTTP_202_ACCEPTED,
                        headers={"Location": reverse("event-detail", args=[event.id])})


class EventDetailView(TenantAPIView):
    """GET one event with its current delivery statuses."""

    @extend_schema(operation_id="events_retrieve", responses=io.EventOutput)
    def get(self, request, event_id):
        event = self.found(selectors.event_get(tenant=self.tenant, event_id=event_id))
        return Response(io.EventOutput(event).data)


class DeliveryListView(TenantAPIView):
    """GET deliveries, newest first; filter by `?status=`, `?endpoint=`, `?event=`."""

    @extend_schema(operation_id="deliveries_list", parameters=[io.DeliveryFilterInput, PageParams],
                   responses=io.DeliveryPageOutput)
    def get(self, request):
        filters = _validated(io.DeliveryFilterInput, request.query_params)
        deliveries = selectors.delivery_list(tenant=self.tenant, status=filters.get("status"),
                                             endpoint_id=filters.get("endpoint"), event_id=filters.get("event"))
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
            delivery = delivery_services.delivery_retry(delivery=delivery)
        except Delivery.DoesNotExist:  # deleted by retention (past EVENT_RETENTION_DAYS) meanwhile
            raise NotFound() from None
        return Response(io.DeliveryOutput(delivery).data, status=status.HTTP_202_ACCEPTED)
