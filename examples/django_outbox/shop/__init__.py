"""The example shop: a Django app of a platform that sends its webhooks through the outbox of Herald."""
