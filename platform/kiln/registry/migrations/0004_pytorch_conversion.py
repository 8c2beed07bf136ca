from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0003_output_kinds'),
    ]

    operations = [
        migrations.AddField(
            model_name='modelversion',
            name='conversion',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AlterField(
            model_name='modelversion',
            name='source_format',
            field=models.CharField(choices=[('onnx', 'Onnx'), ('onnx-zip', 'Onnx Zip'), ('torch-export', 'Torch Export'), ('torchscript', 'Torchscript')], max_length=16),
        ),
    ]
