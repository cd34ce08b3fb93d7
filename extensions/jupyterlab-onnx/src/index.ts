// JupyterLab extension: opens .onnx files in the "ONNX Graph" viewer (the default for them).
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { WidgetTracker } from '@jupyterlab/apputils';
import {
  ABCWidgetFactory,
  DocumentRegistry,
  TextModelFactory
} from '@jupyterlab/docregistry';
import { Contents } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';

import { OnnxGraphDocument } from './widget';

export { fetchGraph, API_PATH } from './api';
export { OnnxGraphDocument, OnnxGraphPanel } from './widget';

const FACTORY = 'ONNX Graph';
const MODEL = 'onnx-workbench-nocontent';
const FILE_TYPE = 'onnx';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">
<g class="jp-icon3" fill="#616161"><rect x="5.5" y="1" width="5" height="3" rx="1"/>
<rect x="1" y="7" width="5" height="3" rx="1"/><rect x="10" y="7" width="5" height="3" rx="1"/>
<rect x="5.5" y="12" width="5" height="3" rx="1"/></g>
<g class="jp-icon-accent0" stroke="#616161" fill="none" stroke-width="1">
<path d="M8 4 L3.5 7 M8 4 L12.5 7 M3.5 10 L8 12 M12.5 10 L8 12"/></g></svg>`;

export const onnxIcon = new LabIcon({
  name: '@onnx-workbench/jupyterlab-onnx:onnx',
  svgstr: ICON_SVG
});

/**
 * A model factory that fetches no content: the server extension reads the file, so the
 * browser never downloads the (possibly large, binary) model through the contents API.
 */
class NoContentModelFactory extends TextModelFactory {
  get name(): string {
    return MODEL;
  }
  get contentType(): Contents.ContentType {
    return 'file';
  }
  get fileFormat(): Contents.FileFormat {
    return null;
  }
}

class OnnxGraphFactory extends ABCWidgetFactory<OnnxGraphDocument, DocumentRegistry.IModel> {
  /** Called after an edit session saved a file (the file browser is refreshed). */
  onSaved: ((path: string) => void) | undefined;

  protected createNewWidget(context: DocumentRegistry.Context): OnnxGraphDocument {
    return new OnnxGraphDocument(context, this.onSaved);
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@onnx-workbench/jupyterlab-onnx:plugin',
  description: 'Opens .onnx files as an interactive graph with a model summary.',
  autoStart: true,
  optional: [ILayoutRestorer],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null) => {
    app.docRegistry.addFileType({
      name: FILE_TYPE,
      displayName: 'ONNX model',
      extensions: ['.onnx'],
      mimeTypes: ['application/x-onnx'],
      contentType: 'file',
      fileFormat: 'base64',
      icon: onnxIcon
    });
    app.docRegistry.addModelFactory(new NoContentModelFactory());
    const factory = new OnnxGraphFactory({
      name: FACTORY,
      label: 'ONNX Graph',
      modelName: MODEL,
      fileTypes: [FILE_TYPE],
      defaultFor: [FILE_TYPE],
      readOnly: true,
      canStartKernel: false
    });
    // the edit endpoint writes the file itself: the file browser would see it only at its next poll
    factory.onSaved = () => {
      if (app.commands.hasCommand('filebrowser:refresh')) {
        void app.commands.execute('filebrowser:refresh');
      }
    };
    const tracker = new WidgetTracker<OnnxGraphDocument>({ namespace: 'onnx-workbench-graph' });
    if (restorer) {
      void restorer.restore(tracker, {
        command: 'docmanager:open',
        args: widget => ({ path: widget.context.path, factory: FACTORY }),
        name: widget => widget.context.path
      });
    }
    factory.widgetCreated.connect((_sender, widget) => {
      widget.title.icon = onnxIcon;
      widget.context.pathChanged.connect(() => void tracker.save(widget));
      void tracker.add(widget);
    });
    app.docRegistry.addWidgetFactory(factory);
  }
};

export default plugin;
