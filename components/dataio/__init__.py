"""The data layer: every step reads and writes its data through this package, and it imports no step.

    storage.py        local and gs:// paths (tf.io.gfile, or LocalFiles without TensorFlow), the one glob, DataError
    gcs.py            the gs:// backend of LocalFiles: google-cloud-storage with tf.io.gfile's meaning
    records.py        the shard format: TFRecord framing (google-crc32c), tf.train.Example (encode ours, parse
                      protobuf), the manifest's shard list; what torch and JAX read
    data.py           the dataset: idx files, record encodings, ShardWriter, the manifest, tf.data readers (the
                      TensorFlow fast path), model loading for evaluation and prediction
    images.py         image files: decoding any format with EXIF orientation, reading, listing, PNG/grid helpers
    pixels.py         the one decoding rule of record images without TensorFlow (Pillow and numpy)
    augment_numpy.py  the online augmentation policies in numpy (the augment step's AugmentPolicy)
    datadir.py        where a step's bulk data goes: inside its artifact, or by reference outside it
"""
