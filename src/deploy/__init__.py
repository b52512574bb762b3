"""Deployment: model file formats (``src.deploy.formats``), export, int8 quantization,
inference, the model record, reports and pages; entry points ``load_network`` (a checkpoint
into a network) and ``load_predictor`` (any model file as batch -> logits). The web service
(``serving``, ``batching``, ``serve_page``) is not exported: it imports the web stack."""
from src.deploy.calibration_report import (
    DIAGRAM_FILE,
    calibration_line,
    calibration_result,
    plot_reliability,
)
from src.deploy.formats import load_predictor
from src.deploy.inference import (
    chunks,
    list_images,
    load_network,
    predict_in_batches,
    preprocess_images,
)
from src.deploy.label_issues import (
    find_issues,
    issue_rows,
    issues_csv,
    issues_page,
    out_of_fold_score,
)
from src.deploy.multilabel_report import MultiLabelReport
from src.deploy.ood_report import HISTOGRAM_FILE, ood_summary, plot_histograms, summary_line
from src.deploy.outputs import (
    batch_answers,
    model_outputs,
    model_probabilities,
    model_thresholds,
)
from src.deploy.publish import (
    check_folder_target,
    model_card,
    save_hub_folder,
    timm_config,
    torchvision_state,
)
from src.deploy.quantize import check_quantize_config, reduce_range_for, select_calibration_images
from src.deploy.records import (
    hub_config,
    write_model_record,
    write_tuned_thresholds,
    write_tuned_values,
)
from src.deploy.report import ClassReport, plot_confusion
from src.deploy.report_page import build_report_page, run_folder_of

__all__ = [
    "load_network", "load_predictor",  # the loaders
    "DIAGRAM_FILE", "calibration_line", "calibration_result", "plot_reliability",  # calibration
    "chunks", "list_images", "predict_in_batches", "preprocess_images",  # inference
    "find_issues", "issue_rows", "issues_csv", "issues_page", "out_of_fold_score",
    "MultiLabelReport",  # multilabel_report
    "HISTOGRAM_FILE", "ood_summary", "plot_histograms", "summary_line",  # ood_report
    "batch_answers", "model_outputs", "model_probabilities", "model_thresholds",  # outputs
    "check_folder_target", "model_card", "save_hub_folder", "timm_config",
    "torchvision_state",  # publish
    "check_quantize_config", "reduce_range_for", "select_calibration_images",  # quantize
    "hub_config", "write_model_record", "write_tuned_thresholds", "write_tuned_values",  # records
    "ClassReport", "plot_confusion",  # report
    "build_report_page", "run_folder_of",  # report_page
]
