from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0002_agent_offline_since'),
    ]

    operations = [
        migrations.AddField(
            model_name='registrationtoken',
            name='expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
