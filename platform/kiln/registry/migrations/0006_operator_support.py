from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0005_pytorch_conversion'),
    ]

    operations = [
        migrations.AddField(model_name='modelversion', name='operator_support', field=models.JSONField(blank=True, default=dict)),
    ]
