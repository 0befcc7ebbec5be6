"""The shop's own data."""
from django.db import models


class Invoice(models.Model):
    number = models.CharField(max_length=32, unique=True)
    amount = models.PositiveIntegerField()
    paid = models.BooleanField(default=False)
