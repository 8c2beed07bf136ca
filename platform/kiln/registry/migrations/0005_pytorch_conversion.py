import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0004_datasets_format_recipe'),
    ]

    operations = [
        migrations.AddField(
            model_name='modelversion',
            name='conversion',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='modelversion',
            name='onnx_blob',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='registry.blob'),
        ),
        migrations.AlterField(
            model_name='modelversion',
            name='source_format',
            field=models.CharField(choices=[('onnx', 'Onnx'), ('onnx-zip', 'Onnx Zip'), ('torch-export', 'Torch Export'), ('torchscript', 'Torchscript')], max_length=16),
        ),
    ]
