"""A broker endpoint's destination (SPEC §14) on its EndpointAccess row; endpoint kinds up to 16 characters."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0026_fair_delivery'),
    ]

    operations = [
        migrations.AddField(
            model_name='endpointaccess',
            name='destination',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='endpointaccess',
            name='encrypted_url',
            field=models.TextField(blank=True, default=''),
        ),
        migrations.AlterField(
            model_name='endpoint',
            name='kind',
            field=models.CharField(choices=[('http', 'http: Herald POSTs each message to its URL'), ('poll', 'poll: its consumer reads its messages'), ('amqp', "amqp: published to an exchange of the tenant's RabbitMQ"), ('redis_stream', "redis_stream: added to a stream of the tenant's Redis"), ('nats', "nats: published to the tenant's NATS JetStream")], db_default='http', default='http', max_length=16),
        ),
    ]
