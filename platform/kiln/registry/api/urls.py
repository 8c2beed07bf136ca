from django.urls import path

from . import views

urlpatterns = [
    path("models/", views.ModelListView.as_view(), name="models"),
    path("models/<id:pk>/", views.ModelDetailView.as_view(), name="model-detail"),
    path("models/<id:pk>/versions/", views.ModelVersionListView.as_view(), name="model-versions"),
    path("models/<id:pk>/versions/<id:number>/", views.ModelVersionDetailView.as_view(), name="model-version-detail"),
    path("models/<id:pk>/versions/<id:number>/download/", views.ModelVersionDownloadView.as_view(), name="model-version-download"),
    path("models/<id:pk>/versions/<id:number>/recipe/", views.ModelVersionRecipeView.as_view(), name="model-version-recipe"),
    path("datasets/", views.DatasetListView.as_view(), name="datasets"),
    path("datasets/preview/", views.DatasetPreviewView.as_view(), name="dataset-preview"),
    path("datasets/<id:pk>/", views.DatasetDetailView.as_view(), name="dataset-detail"),
    path("storage/", views.StorageView.as_view(), name="storage"),
    path("uploads/", views.UploadListView.as_view(), name="uploads"),
    path("uploads/<uuid:upload_id>/", views.UploadDetailView.as_view(), name="upload-detail"),
]
